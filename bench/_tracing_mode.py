"""``--tracing`` of bench/turn_overhead.py: the CPU a run's turns cost with tracing off and on.

- ``off``: as shipped without ``OTEL_EXPORTER_OTLP_ENDPOINT`` (no provider, no span object);
- ``on``: the platform's GenAI spans (``invoke_agent``, ``chat``, ``execute_tool``) through an SDK
  ``TracerProvider`` with the span processors production uses (the tenant stamp and the
  ``BatchSpanProcessor``, as :func:`agent_platform.telemetry.configure`), to an exporter that
  counts and drops them (no network: the OTLP encoding and send happen on the processor's
  thread, not in the run loop, and a receiver's speed is not the platform's), and the Django,
  Celery and httpx instrumentations (:func:`agent_platform.telemetry.instrument_libraries`);
- ``on-libraries``: ``on`` plus the psycopg and redis instrumentations, whose client spans a
  production process makes with ``TRACING_STATEMENT_SPANS=1`` (one per SQL statement and Redis
  command of the turn);
- ``alternate``: ``on``'s set-up, the platform's spans turned off and on run by run in the same
  process (a first run with spans on to warm both paths up, not counted, then off, on, on, off,
  ...: give ``--runs`` a multiple of 4, plus 1): both modes share the heap,
  the warm caches and the machine's load of the moment, which separate processes minutes apart
  do not; prints each mode's CPU per turn (median and mean of its runs) and the paired
  difference.

The CPU is this process's (``time.process_time()``: the run loop, its database threads and the
span processor's thread), over the runs' execution only; the fake model runs in its own process.
The report splits it: the run loop's thread (``time.thread_time()`` of the thread that runs
the runs), the other threads (the database threads, the span processor's), and the garbage
collector's collections in the window (``gc.callbacks``: how many per generation, and their
CPU, whichever thread triggered them). A full (generation-2) collection walks every object of
the process, the whole of Django and the libraries unless the heap is frozen as the worker's
run host freezes it (``--worker-tuning``): 160-240 ms here, as much as 20 turns. ``on``'s set-up
(the SDK's and the instrumentations' imports) used to bring one into every ``on`` round and no
``off`` round (bench/README.md, "Tracing cost"): :meth:`TracingMode.start` collects first.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any

MODES = ("off", "on", "on-libraries", "alternate")
ALTERNATE_ORDER = ("off", "on", "on", "off")
"""``alternate``'s modes, run after run (ABBA: a drift of the machine's load weighs on both)."""


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
        self.processors: Any = None
        self.cpu_seconds = 0.0
        self.loop_thread_seconds = 0.0
        self.gc_collections = [0, 0, 0]
        self.gc_seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._thread_started = 0.0
        self._gc_started = 0.0
        self.run_cpu_seconds: dict[str, list[float]] = {}
        """Process CPU seconds of each run, by the mode it ran in."""
        self._runs = 0
        self._run_started = 0.0

    def install(self) -> None:
        """Install the tracer provider, its processors and the instrumentations (not for ``off``)."""
        if self.mode == "off":
            return
        from opentelemetry import trace
        from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from agent_platform import telemetry
        from tenants.context import current_tenant_id

        self.exporter = _CountingExporter()
        self.processors = SynchronousMultiSpanProcessor()
        self.provider = TracerProvider(active_span_processor=self.processors)
        # As telemetry.configure() sets it up: the tenant stamp, then the batch processor.
        self.provider.add_span_processor(telemetry.TenantSpanProcessor(current_tenant_id))
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        trace.set_tracer_provider(self.provider)
        # As configure() does: Django, Celery and httpx; psycopg and redis with TRACING_STATEMENT_SPANS.
        telemetry.instrument_libraries(statement_spans=self.mode == "on-libraries")
        telemetry.enable(self.provider, self.processors)

    def run_mode(self) -> str:
        """The mode the next (or current) run runs in: with ``alternate``, ``warm-up`` (spans on)
        for the first run, then :data:`ALTERNATE_ORDER`'s turn."""
        if self.mode != "alternate":
            return self.mode
        return "warm-up" if self._runs == 0 else ALTERNATE_ORDER[(self._runs - 1) % len(ALTERNATE_ORDER)]

    def run_starts(self) -> None:
        """Before each run: with ``alternate``, the platform's spans turned on or off for it."""
        if self.mode == "alternate":
            from agent_platform import telemetry

            if self.run_mode() in ("on", "warm-up"):
                telemetry.enable(self.provider, self.processors)
            else:
                telemetry.disable()
        self._run_started = time.process_time()

    def run_ended(self) -> None:
        """After each run: its process CPU, under its mode."""
        self.run_cpu_seconds.setdefault(self.run_mode(), []).append(time.process_time() - self._run_started)
        self._runs += 1

    def start(self) -> None:
        """Start counting: process CPU, this thread's CPU (call it on the thread that runs the
        runs) and the garbage collector's collections.

        A full collection first, outside the window: the set-up's allocations (``on`` imports
        the SDK and the instrumentations) would otherwise bring the next full collection
        (100-200 ms here: the heap is not frozen) into the runs of one mode and not the other's.
        """
        gc.collect()
        gc.callbacks.append(self._on_gc)
        self._thread_started = time.thread_time()
        self._started = time.process_time()

    def stop(self) -> None:
        """Stop counting (after the span processor's queue is flushed: its export is counted)."""
        if self.provider is not None:
            self.provider.force_flush()
        self.cpu_seconds = time.process_time() - self._started
        self.loop_thread_seconds = time.thread_time() - self._thread_started
        gc.callbacks.remove(self._on_gc)
        if self.mode == "alternate":
            from agent_platform import telemetry

            telemetry.enable(self.provider, self.processors)  # on_path_costs() needs the tracer

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks`` hook: each collection's generation and CPU (of the collecting thread)."""
        if phase == "start":
            self._gc_started = time.thread_time()
            return
        generation = info["generation"]
        self.gc_collections[generation] += 1
        self.gc_seconds[generation] += time.thread_time() - self._gc_started

    def report(self, turns: int) -> str:
        """Two lines: CPU per turn (ms) of the process, the run loop's thread, the other threads
        and (of these) the garbage collector; the collections per generation."""
        spans = "" if self.exporter is None else f", {self.exporter.spans / turns:.1f} spans per turn exported"
        per_turn = 1000 / turns
        collections = ", ".join(f"gen{g} {n} ({self.gc_seconds[g] * 1000:.0f} ms)"
                                for g, n in enumerate(self.gc_collections))
        lines = [f"tracing {self.mode}: process CPU per turn {self.cpu_seconds * per_turn:.2f} ms{spans}",
                 f"  of which: the run loop's thread {self.loop_thread_seconds * per_turn:.2f} ms, other threads "
                 f"(database, span processor) {(self.cpu_seconds - self.loop_thread_seconds) * per_turn:.2f} ms; "
                 f"garbage collections {sum(self.gc_seconds) * per_turn:.2f} ms per turn: {collections}"]
        if self.mode == "alternate":
            lines.append(self._alternate_report(turns / max(self._runs, 1)))
        return "\n".join(lines)

    def _alternate_report(self, turns_per_run: float) -> str:
        """``alternate``'s figures: each mode's CPU per turn over its runs, and on − off per ABBA pair."""
        import statistics

        per_turn = {mode: [s * 1000 / turns_per_run for s in runs] for mode, runs in self.run_cpu_seconds.items()}
        off, on = per_turn.get("off", []), per_turn.get("on", [])
        if not off or not on:
            return "  alternate: too few runs (give --runs a multiple of 4, plus 1)"
        pairs = [b - a for a, b in zip(off, on, strict=False)]
        base = statistics.median(off)
        return (f"  alternate, CPU per turn of a run: off median {base:.2f} ms (mean {statistics.fmean(off):.2f}, "
                f"{len(off)} runs), on median {statistics.median(on):.2f} ms (mean {statistics.fmean(on):.2f}, "
                f"{len(on)} runs); on - off per pair: median {statistics.median(pairs):+.2f} ms "
                f"({statistics.median(pairs) / base * 100:+.1f} %), mean {statistics.fmean(pairs):+.2f} ms")


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
    from sessions.runner import tracing

    spec = SimpleNamespace(entries=(SimpleNamespace(api="openai", base_url="http://127.0.0.1:1/v1"),),
                           session_id=1, tenant_id=1, run_id=1)
    attempt = AttemptRecord(entry_index=0, provider_name="p", model="bench-model", attempt=1, latency_ms=900,
                            first_token_ms=80, prompt_tokens=500, completion_tokens=30, usage_estimated=False,
                            status="succeeded", error_class=None, error="", finish_reason="stop",
                            response_model="bench-model")
    observer = tracing.AttemptObserver(spec, None)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()

    def chat_span() -> None:
        loop.run_until_complete(observer(attempt))

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

    from opentelemetry import trace

    # Each round starts with the batch processor's queue empty: 2,000 spans fit its 2,048, so
    # none is dropped (a drop is cheaper than a queued span and would flatter the figure).
    flush = trace.get_tracer_provider().force_flush
    try:
        base = min(timeit.repeat(bare, number=2_000, repeat=5))
        chat = (min(timeit.repeat(chat_span, setup=flush, number=2_000, repeat=5)) - base) / 2_000 * 1e6
        tool = (min(timeit.repeat(tool_span, setup=flush, number=2_000, repeat=5)) - base) / 2_000 * 1e6
    finally:
        loop.close()
    return f"on path: chat span {chat:.0f} µs (with the attempt's metrics), execute_tool span {tool:.0f} µs"
