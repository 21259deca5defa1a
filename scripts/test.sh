#!/usr/bin/env bash
# `make test`: set everything up (venv, services, database, the embedded models, Chromium),
# then run the whole suite. Extra arguments go to pytest.
#
# The suite runs on TEST_WORKERS pytest-xdist workers (default 3 on this 2-core machine: with 2,
# a third of the cores' time went idle while workers waited on servers, sockets and sleeps;
# docs/testing.md has the figures), each with its own test
# database, Redis key prefix and Celery queue (agent_platform/settings_test.py), tests sent to
# whichever worker is free (--dist load: not loadgroup, loadfile or loadscope, which key the tests
# by node id and ran only 2 of schemathesis' 164, whose ids repeat under pytest 9). Given a test
# path or node id (`scripts/test.sh sessions/tests/test_cancellation.py::test_x`), it runs in
# this process, without workers (TEST_WORKERS=3 to spread it anyway). A `-n N` of the arguments
# wins over the default; `-n 0` runs the whole suite in one process. docs/testing.md says more.
set -euo pipefail
cd "$(dirname "$0")/.."
BOOTSTRAP_FOR_TESTS=1 scripts/bootstrap.sh  # the demo database's keys do not stop the tests
scripts/ensure_chromium.sh
.venv/bin/python scripts/setup_model.py >/dev/null
.venv/bin/python scripts/setup_embedder.py >/dev/null

# Python may write its bytecode here (an environment that says PYTHONDONTWRITEBYTECODE=1 makes
# every worker and every program a test starts compile the project again, and pytest rewrite
# the asserts of ~600 test and plugin modules in each worker: ~15 s of CPU each time).
unset PYTHONDONTWRITEBYTECODE

workers=${TEST_WORKERS:-}
if [ -z "$workers" ]; then
  workers=3
  for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then  # a test file, directory or node id: a few tests
      workers=0
    fi
  done
fi
# --durations: the 30 slowest tests close every run's output, where CI's time goes (docs/testing.md).
exec .venv/bin/pytest -n "$workers" --dist load --durations=30 "$@"
