#!/usr/bin/env bash
# `make run`: set everything up, then start the model servers (chat, embeddings), a Celery worker and the ASGI
# server; print the URLs; stop them all on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python may write its bytecode (an environment that says PYTHONDONTWRITEBYTECODE=1, as this
# machine's does, makes every process compile every module it imports at every start: the
# dependencies are installed without bytecode, scripts/bootstrap.sh; importing the web app took
# 6.9 s of CPU so, 2.9 s with bytecode; docs/operations-security.md, "Bytecode").
unset PYTHONDONTWRITEBYTECODE
scripts/bootstrap.sh
PY=.venv/bin/python
# Served as in production: DEBUG off (no debug pages, no SQL kept in memory). The keys come from
# the secrets file bootstrap generated once (0600; beside the machine's local PostgreSQL, e.g.
# /var/lib/agent-platform/secrets.env, or var/secrets.env with DATABASE_URL); the settings read
# it, so no key sits in these processes' environment (agent_platform/local_secrets.py).
export DEBUG=${DEBUG:-0}
if [ "$DEBUG" != 0 ]; then
  echo "[run] WARNING: DEBUG=$DEBUG: error pages show settings and code; never expose this to a network" >&2
fi
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
LLM_PORT=${LLM_PORT:-8081}
export LLM_BASE_URL=${LLM_BASE_URL:-http://127.0.0.1:${LLM_PORT}/v1}
# The larger chat model (Qwen2.5-Coder-1.5B, ~2.1 GB resident) the demo Assistant's route tries
# first (docs/model-accuracy.md); LLM_LARGE_BASE_URL= (empty) serves none.
LLM_LARGE_PORT=${LLM_LARGE_PORT:-8083}
export LLM_LARGE_BASE_URL=${LLM_LARGE_BASE_URL-http://127.0.0.1:${LLM_LARGE_PORT}/v1}
EMBEDDINGS_PORT=${EMBEDDINGS_PORT:-8082}
export EMBEDDINGS_BASE_URL=${EMBEDDINGS_BASE_URL:-http://127.0.0.1:${EMBEDDINGS_PORT}/v1}
mkdir -p var/log
# Prometheus multiprocess mode (docs/observability.md): the worker and the web process write their
# metrics here and /metrics sums them; emptied before they start (an operator's own directory too).
export PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-$PWD/var/prometheus}
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
find "$PROMETHEUS_MULTIPROC_DIR" -maxdepth 1 -name '*.db' -delete

$PY manage.py seed_demo

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo; echo "[run] stopping…" >&2
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "[run] stopped" >&2
}
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT

if curl -fsS "http://127.0.0.1:${LLM_PORT}/v1/models" >/dev/null 2>&1; then
  echo "[run] a model server already answers on :${LLM_PORT}; using it" >&2
else
  $PY scripts/setup_model.py
  LLM_PORT=$LLM_PORT $PY scripts/llm_server.py >var/log/llm.log 2>&1 &
  pids+=($!)
fi
if [ -z "$LLM_LARGE_BASE_URL" ]; then
  :
elif curl -fsS "$LLM_LARGE_BASE_URL/models" >/dev/null 2>&1; then
  echo "[run] a model server already answers at $LLM_LARGE_BASE_URL; using it" >&2
elif [ "$LLM_LARGE_BASE_URL" != "http://127.0.0.1:${LLM_LARGE_PORT}/v1" ]; then
  echo "[run] no model server answers at $LLM_LARGE_BASE_URL yet; the Assistant falls back to the 0.5B until one does" >&2
elif $PY scripts/setup_model.py --model qwen2.5-coder-1.5b-instruct; then
  LLM_MODEL_NAME=qwen2.5-coder-1.5b-instruct LLM_PORT=$LLM_LARGE_PORT $PY scripts/llm_server.py >var/log/llm-large.log 2>&1 &
  pids+=($!)
  large_started=1
else
  echo "[run] the larger model could not be set up; the Assistant falls back to the 0.5B" >&2
fi
# The embedded embedding model (all-MiniLM-L6-v2) in a llama.cpp server of its own: knowledge
# bases and memories embed through it.
if curl -fsS "http://127.0.0.1:${EMBEDDINGS_PORT}/v1/models" >/dev/null 2>&1; then
  echo "[run] an embeddings server already answers on :${EMBEDDINGS_PORT}; using it" >&2
else
  $PY scripts/setup_embedder.py
  LLM_ROLE=embeddings EMBEDDINGS_PORT=$EMBEDDINGS_PORT $PY scripts/llm_server.py >var/log/embeddings.log 2>&1 &
  pids+=($!)
fi
.venv/bin/celery -A agent_platform worker -l info --pool threads >var/log/worker.log 2>&1 &
pids+=($!)
# Celery beat: the run sweeper (orphaned runs resume or fail, approvals expire).
.venv/bin/celery -A agent_platform beat -l info --schedule var/celerybeat-schedule >var/log/beat.log 2>&1 &
pids+=($!)
$PY -m agent_platform.web --host "$HOST" --port "$PORT" --log-level warning >var/log/web.log 2>&1 &
pids+=($!)

$PY scripts/llm_server.py --wait "$LLM_BASE_URL" --timeout 300 || { echo "[run] the model server did not start: see var/log/llm.log" >&2; exit 1; }
$PY scripts/llm_server.py --wait "$EMBEDDINGS_BASE_URL" --timeout 120 || { echo "[run] the embeddings server did not start: see var/log/embeddings.log" >&2; exit 1; }
if [ -n "${large_started:-}" ]; then
  # Not fatal: the Assistant's route falls back to the 0.5B while the 1.5B is away.
  $PY scripts/llm_server.py --wait "$LLM_LARGE_BASE_URL" --timeout 300 \
    || echo "[run] the larger model's server did not start (see var/log/llm-large.log); the Assistant falls back to the 0.5B" >&2
fi
for _ in $(seq 1 60); do curl -fsS "http://$HOST:$PORT/api/schema/" >/dev/null 2>&1 && break; sleep 0.5; done

cat <<MSG

  Agent Platform is up.
    Chat app     http://$HOST:$PORT/            (demo-user / demo-user-pass)
    Console      http://$HOST:$PORT/admin/      (demo-admin / demo-admin-pass)
    API docs     http://$HOST:$PORT/api/docs/
    Model        $LLM_BASE_URL${LLM_LARGE_BASE_URL:+  (larger: $LLM_LARGE_BASE_URL)}
    Embeddings   $EMBEDDINGS_BASE_URL
  Logs in var/log/. Ctrl-C stops everything.

MSG
wait -n "${pids[@]}"
echo "[run] a process exited; see var/log/" >&2
