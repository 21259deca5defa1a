#!/usr/bin/env bash
# `make test`: set everything up (venv, services, database, the embedded models, Chromium),
# then run the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/ensure_chromium.sh
.venv/bin/python scripts/setup_model.py >/dev/null
.venv/bin/python scripts/setup_embedder.py >/dev/null
exec .venv/bin/pytest "$@"
