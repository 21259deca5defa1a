#!/usr/bin/env bash
# The docs' console screenshots (docs/console-trace.png, docs/console-trace-server-log.png,
# docs/console-dashboard.png, docs/console-playground.png), taken in Debian's Chromium from the
# platform as it runs in the browser tests: the real ASGI app (uvicorn), a real Celery worker,
# PostgreSQL and Redis, with the FakeLLMServer behind the agents' routes (and the progress/log
# test MCP server for the server log). Needs the venv (make test sets it up).
set -euo pipefail
cd "$(dirname "$0")/.."
CONSOLE_SCREENSHOTS_DIR="$PWD/docs" TEST_ISOLATION="${TEST_ISOLATION:-screenshots}" \
  .venv/bin/pytest console/tests/test_console_browser.py -m browser -q -p no:cacheprovider \
  -k "trace or dashboard or playground"
ls -l docs/console-trace.png docs/console-trace-server-log.png docs/console-dashboard.png docs/console-playground.png
