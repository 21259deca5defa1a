"""The run trace, as the console's pages knew it: now :mod:`sessions.trace_selectors`.

The trace is a sessions selector (the end-user API ``GET /api/v1/runs/<id>/trace/`` serves
it as well as the console's trace page); these names stay importable from here.
"""

from __future__ import annotations

from sessions.trace_selectors import ADMIN_ONLY_FIELDS, run_trace, usd

__all__ = ["ADMIN_ONLY_FIELDS", "run_trace", "usd"]
