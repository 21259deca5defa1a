"""Metrics: Prometheus, correct across the web and worker processes.

Every process records into prometheus-client's metrics below; the web process serves them at
``/metrics`` (:mod:`agent_platform.metrics_view`) to the operator only. With several processes
(a worker beside the web process, several web processes) set ``PROMETHEUS_MULTIPROC_DIR`` to an
empty directory, the same for all of them, before they start (``scripts/run.sh`` does): each
process then writes its values to memory-mapped files there and ``/metrics`` sums them
(prometheus-client's multiprocess mode). Gauges of live state (MCP sessions) use the
``livesum`` mode: a dead process's values drop out when it is marked dead
(:func:`process_exited`).

The GenAI metrics follow the OpenTelemetry semantic conventions for generative AI
(:data:`agent_platform.telemetry.SEMCONV_VERSION`), named the way an OpenTelemetry
Prometheus exporter names them (dots to underscores, ``_seconds`` for durations) and with the
conventions' bucket boundaries:

- ``gen_ai_client_token_usage`` (histogram, tokens): per model call attempt, ``gen_ai_token_type``
  ``input`` or ``output``;
- ``gen_ai_client_operation_duration_seconds`` (histogram): per attempt, ``error_type`` "" when it
  succeeded;
- ``gen_ai_client_operation_time_to_first_chunk_seconds`` (histogram): time to the first token
  (text, reasoning or tool-call fragment) of attempts that got one.

The platform's own: runs ended by status and reason, Celery task queue wait and duration,
HTTP latency by view, MCP pool sessions, sandbox spawns; scraped live from the database and
Redis by the web process: runs by status now, approvals waiting, queue depth
(:mod:`agent_platform.metrics_view`).

Project infrastructure: no app imports; the apps call the small functions below.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

from prometheus_client import Counter, Gauge, Histogram

TOKEN_BUCKETS: Final = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
"""``gen_ai.client.token.usage``'s advised boundaries."""
DURATION_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
"""``gen_ai.client.operation.duration``'s advised boundaries, seconds."""
FIRST_CHUNK_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""``gen_ai.client.operation.time_to_first_chunk``'s advised boundaries, seconds."""
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
"""HTTP requests and Celery tasks, seconds."""

_GEN_AI_LABELS = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")

TOKEN_USAGE = Histogram("gen_ai_client_token_usage", "Tokens per model call attempt (input or output).",
                        [*_GEN_AI_LABELS, "gen_ai_token_type"], buckets=TOKEN_BUCKETS)
OPERATION_DURATION = Histogram("gen_ai_client_operation_duration_seconds",
                               "Duration of a model call attempt, seconds (error_type: its error class, or empty).",
                               [*_GEN_AI_LABELS, "error_type"], buckets=DURATION_BUCKETS)
TIME_TO_FIRST_CHUNK = Histogram("gen_ai_client_operation_time_to_first_chunk_seconds",
                                "Time from a model request to its first streamed fragment, seconds.",
                                list(_GEN_AI_LABELS), buckets=FIRST_CHUNK_BUCKETS)
RUNS_ENDED = Counter("agent_platform_runs_ended_total",
                     "Runs (and sub-runs) that ended or paused, by status and failure reason.",
                     ["status", "reason", "depth"])
TASK_QUEUE_WAIT = Histogram("agent_platform_celery_task_queue_wait_seconds",
                            "From a Celery task's publish to its start on a worker, seconds.", ["task"],
                            buckets=LATENCY_BUCKETS)
TASK_DURATION = Histogram("agent_platform_celery_task_duration_seconds",
                          "Celery task run time on the worker, seconds (state: SUCCESS, FAILURE, RETRY...).",
                          ["task", "state"], buckets=LATENCY_BUCKETS)
HTTP_DURATION = Histogram("agent_platform_http_request_duration_seconds",
                          "Django HTTP request latency by view (route name), method and status class, seconds.",
                          ["view", "method", "status"], buckets=LATENCY_BUCKETS)
MCP_SESSIONS = Gauge("agent_platform_mcp_pool_sessions", "MCP client sessions open in the workers' pools.",
                     multiprocess_mode="livesum")
SANDBOX_SPAWNS = Counter("agent_platform_sandbox_spawns_total", "Sandboxed processes started (CLI commands).",
                         ["kind"])
ALL_METRICS: Final = (TOKEN_USAGE, OPERATION_DURATION, TIME_TO_FIRST_CHUNK, RUNS_ENDED, TASK_QUEUE_WAIT, TASK_DURATION,
                      HTTP_DURATION, MCP_SESSIONS, SANDBOX_SPAWNS)
"""Every metric above (a single-process scrape registers them on its registry)."""

SENT_AT_HEADER: Final = "ap_sent_at"
"""The Celery message header carrying the publish time (Unix seconds) for the queue wait."""


def multiprocess_dir() -> str:
    """``PROMETHEUS_MULTIPROC_DIR`` ("" when the process records in memory only)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")


_attempt_children: dict[tuple[str, str, str, str], tuple[Any, Any, Any, Any]] = {}
"""The labelled children of the GenAI histograms per (operation, provider, model, error_type):
``.labels()`` takes a lock and builds its key on every call (~10 µs of the 40 an attempt cost)."""


def model_attempt_observe(attempt: Any, *, provider: str, operation: str = "chat") -> None:
    """Observe one model call attempt (an :class:`llm.records.AttemptRecord`): tokens (input,
    output), duration (``error_type``: its error class when it failed) and time to first chunk."""
    error_type = "" if attempt.status == "succeeded" else (attempt.error_class or "other")
    key = (operation, provider, attempt.model, error_type)
    children = _attempt_children.get(key)
    if children is None:
        labels = key[:3]
        children = _attempt_children[key] = (
            TOKEN_USAGE.labels(*labels, "input"), TOKEN_USAGE.labels(*labels, "output"),
            OPERATION_DURATION.labels(*labels, error_type), TIME_TO_FIRST_CHUNK.labels(*labels),
        )
    tokens_in, tokens_out, duration, first_chunk = children
    tokens_in.observe(attempt.prompt_tokens)
    tokens_out.observe(attempt.completion_tokens)
    duration.observe(attempt.latency_ms / 1000)
    if attempt.first_token_ms is not None:
        first_chunk.observe(attempt.first_token_ms / 1000)


def run_ended(*, status: str, reason: str, depth: int = 0) -> None:
    """Count a run's end (or pause: status ``awaiting_approval``)."""
    RUNS_ENDED.labels(status, reason or "", "0" if depth == 0 else "sub").inc()


def mcp_session_opened() -> None:
    """An MCP pool session finished its handshake."""
    MCP_SESSIONS.inc()


def mcp_session_closed() -> None:
    """An MCP pool session that had connected is gone."""
    MCP_SESSIONS.dec()


def sandbox_spawned(kind: str = "cli") -> None:
    """A sandboxed process was started."""
    SANDBOX_SPAWNS.labels(kind).inc()


# --- Celery -----------------------------------------------------------------------------------

_task_started: dict[str, float] = {}


def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        headers[SENT_AT_HEADER] = time.time()


def _task_prerun(task_id: str = "", task: Any = None, **_: Any) -> None:
    _task_started[task_id] = time.monotonic()
    request = getattr(task, "request", None)
    sent_at = getattr(request, SENT_AT_HEADER, None)
    if sent_at is None:
        sent_at = (getattr(request, "headers", None) or {}).get(SENT_AT_HEADER)
    if isinstance(sent_at, (int, float)):
        TASK_QUEUE_WAIT.labels(getattr(task, "name", "")).observe(max(0.0, time.time() - sent_at))


def _task_postrun(task_id: str = "", task: Any = None, state: str | None = None, **_: Any) -> None:
    started = _task_started.pop(task_id, None)
    if started is not None:
        TASK_DURATION.labels(getattr(task, "name", ""), state or "").observe(time.monotonic() - started)


def celery_signals_connect() -> None:
    """Measure Celery tasks: the publish time in each message's headers (``before_task_publish``),
    the queue wait and the run time on the worker (``task_prerun`` / ``task_postrun``)."""
    from celery.signals import before_task_publish, task_postrun, task_prerun

    before_task_publish.connect(_stamp_sent_at, weak=False)
    task_prerun.connect(_task_prerun, weak=False)
    task_postrun.connect(_task_postrun, weak=False)


def process_exited(pid: int | None = None) -> None:
    """Mark this process (or ``pid``) dead in multiprocess mode: its ``livesum`` gauges drop out."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid() if pid is None else pid)


# --- HTTP -------------------------------------------------------------------------------------


class HttpMetricsMiddleware:
    """Django middleware: each request's latency in ``agent_platform_http_request_duration_seconds``
    by view (the URL pattern's name, else its route; ``unresolved`` for a 404 without one),
    method and status class (``2xx``...). Sync and async capable."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction

        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self._acall(request)
        started = time.perf_counter()
        response = self.get_response(request)
        _observe(request, response, started)
        return response

    async def _acall(self, request: Any) -> Any:
        started = time.perf_counter()
        response = await self.get_response(request)
        _observe(request, response, started)
        return response


def _observe(request: Any, response: Any, started: float) -> None:
    match = getattr(request, "resolver_match", None)
    view = "unresolved" if match is None else (match.view_name or match.route or "unnamed")
    status = f"{getattr(response, 'status_code', 0) // 100}xx"
    HTTP_DURATION.labels(view, request.method or "", status).observe(time.perf_counter() - started)


__all__ = [
    "HttpMetricsMiddleware", "celery_signals_connect", "mcp_session_closed", "mcp_session_opened",
    "model_attempt_observe", "multiprocess_dir", "process_exited", "run_ended", "sandbox_spawned",
]
