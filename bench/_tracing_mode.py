"""``--tracing`` of bench/turn_overhead.py: the CPU a run's turns cost with tracing off and on.

- ``off``: as shipped without ``OTEL_EXPORTER_OTLP_ENDPOINT`` (no provider, no span object);
- ``on``: the platform's GenAI spans (``invoke_agent``, ``chat``, ``execute_tool``) through an SDK
  ``TracerProvider`` with the ``BatchSpanProcessor`` production uses, to an exporter that
  counts and drops them (no network: the OTLP encoding and send happen on the processor's
  thread, not in the run loop, and a receiver's speed is not the platform's);
- ``on-libraries``: ``on`` plus the psycopg and redis instrumentations, whose client spans a
  production process also makes (one per SQL statement and Redis command of the turn).

The CPU is this process's (``time.process_time()``: the run loop, its database threads and the
span processor's thread), over the runs' execution only; the fake model runs in its own process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

MODES = ("off", "on", "on-libraries")


class _CountingExporter:
    """A span exporter that counts what it is given and keeps nothing."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class TracingMode:
    """Installs tracing for ``mode`` (:data:`MODES`) and measures CPU around the runs."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.exporter: _CountingExporter | None = None
        self.provider: Any = None
        self.cpu_seconds = 0.0
        self._started = 0.0

    def install(self) -> None:
        if self.mode == "off":
            return
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from agent_platform import telemetry

        self.exporter = _CountingExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        trace.set_tracer_provider(self.provider)
        if self.mode == "on-libraries":
            from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
            from opentelemetry.instrumentation.redis import RedisInstrumentor

            PsycopgInstrumentor().instrument(enable_commenter=False)
            RedisInstrumentor().instrument()
        telemetry.enable(self.provider)

    def start(self) -> None:
        self._started = time.process_time()

    def stop(self) -> None:
        if self.provider is not None:
            self.provider.force_flush()
        self.cpu_seconds = time.process_time() - self._started

    def report(self, turns: int) -> str:
        spans = "" if self.exporter is None else f", {self.exporter.spans / turns:.1f} spans per turn exported"
        return f"tracing {self.mode}: process CPU per turn {self.cpu_seconds * 1000 / turns:.2f} ms{spans}"


def off_path_costs() -> str:
    """What a turn runs through with tracing off that it did not before tracing existed, CPU µs
    per call (best of 5 rounds of 20,000): the attempt observer (the model-call metrics, one per
    attempt) and the tracing wrapper's pass-through (one per tool call)."""
    import asyncio
    import timeit

    from agent_platform import metrics, telemetry
    from llm.records import AttemptRecord

    assert not telemetry.TRACING
    attempt = AttemptRecord(entry_index=0, provider_name="p", model="bench-model", attempt=1, latency_ms=900,
                            first_token_ms=80, prompt_tokens=500, completion_tokens=30, usage_estimated=False,
                            status="succeeded", error_class=None, error="")
    observe = min(timeit.repeat(lambda: metrics.model_attempt_observe(attempt, provider="openai"),
                                number=20_000, repeat=5)) / 20_000 * 1e6

    class _Inner:
        async def call_tool(self, call: Any) -> Any:
            return call

    from sessions.runner.tracing import TracingToolset

    wrapped, bare = TracingToolset(_Inner()), _Inner()

    async def calls(toolset: Any, n: int) -> float:
        started = time.process_time()
        for _ in range(n):
            await toolset.call_tool(None)
        return time.process_time() - started

    loop = asyncio.new_event_loop()
    try:
        extra = min(loop.run_until_complete(calls(wrapped, 20_000)) - loop.run_until_complete(calls(bare, 20_000))
                    for _ in range(5)) / 20_000 * 1e6
    finally:
        loop.close()
    return (f"off path: model-call metrics {observe:.2f} µs per attempt, tracing wrapper pass-through "
            f"{max(extra, 0.0):.2f} µs per tool call")


def on_path_costs() -> str:
    """CPU µs of the spans a turn makes with tracing on (installed by :meth:`TracingMode.install`),
    each alone (best of 5 rounds of 2,000): a ``chat`` span from an attempt record and an
    ``execute_tool`` span around a call that returns at once."""
    import asyncio
    import timeit
    from types import SimpleNamespace

    from llm.records import AttemptRecord
    from llm.types import ChatMessage, Completion, Usage
    from sessions.runner import tracing

    spec = SimpleNamespace(entries=(SimpleNamespace(api="openai", base_url="http://127.0.0.1:1/v1"),),
                           session_id=1, tenant_id=1, run_id=1)
    attempt = AttemptRecord(entry_index=0, provider_name="p", model="bench-model", attempt=1, latency_ms=900,
                            first_token_ms=80, prompt_tokens=500, completion_tokens=30, usage_estimated=False,
                            status="succeeded", error_class=None, error="")
    completion = Completion(message=ChatMessage(role="assistant", content="ok"), usage=Usage(), finish_reason="stop",
                            entry_index=0, model="bench-model")
    observer = tracing.AttemptObserver(spec, None)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()

    def chat_span() -> None:
        loop.run_until_complete(observer(attempt))
        observer.completed(completion)

    def bare() -> None:
        loop.run_until_complete(asyncio.sleep(0))

    tracing._content_cache[1] = (float("inf"), False)

    class _Inner:
        async def call_tool(self, call: Any) -> Any:
            return SimpleNamespace(status="succeeded", code="", error="", content="")

    call = SimpleNamespace(name="test_echo", origin=None, arguments={"text": "hi"},
                           context=SimpleNamespace(tool_call_id=1, tenant_id=1, run_id=1, session_id=1))
    toolset = tracing.TracingToolset(_Inner())

    def tool_span() -> None:
        loop.run_until_complete(toolset.call_tool(call))

    try:
        base = min(timeit.repeat(bare, number=2_000, repeat=5))
        chat = (min(timeit.repeat(chat_span, number=2_000, repeat=5)) - base) / 2_000 * 1e6
        tool = (min(timeit.repeat(tool_span, number=2_000, repeat=5)) - base) / 2_000 * 1e6
    finally:
        loop.close()
    return f"on path: chat span {chat:.0f} µs (with the attempt's metrics), execute_tool span {tool:.0f} µs"
