// The console's small helpers (loaded on every console page; no inline scripts under the CSP).
// Each helper looks for its own markers and does nothing on pages without them.
"use strict";
