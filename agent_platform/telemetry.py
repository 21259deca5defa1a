"""Traces: OpenTelemetry, configured only when the operator points it at a receiver.

Nothing here is configured, and nothing exported, unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set in the process's environment: then
:func:`configure` installs an SDK ``TracerProvider`` exporting over OTLP/HTTP with protobuf
(the exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables: headers, timeout,
compression) and instruments Django, Celery and httpx; psycopg and redis (a span per SQL
statement and Redis command) only with ``TRACING_STATEMENT_SPANS``. ``make run`` and CI stay
offline.

The run engine checks :data:`TRACING` (a module-level flag) before it builds anything for a
span, so a process without tracing creates no span objects at all: the hot path costs one
attribute read (``bench/turn_overhead.py --tracing``).

Span names and attributes follow the OpenTelemetry semantic conventions for generative AI,
version :data:`SEMCONV_VERSION` (schema :data:`SCHEMA_URL`; the GenAI conventions are still
"Development" status there, so the version is pinned and stated on every span's scope). The
names are spelled out below rather than imported from ``opentelemetry.semconv._incubating``
(a private module). Every span the platform starts carries the tenant's id (:data:`TENANT_ID`);
library spans (HTTP, Celery, and SQL and Redis with ``TRACING_STATEMENT_SPANS``) get it when
they start inside a tenant's scope.

This module is project infrastructure: no app imports. The GenAI spans of a run are made by
:mod:`sessions.runner.tracing`; the tenant scope reaches the span processor through the
``tenant_of`` callable given to :func:`configure`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)

_UNSET = Status(StatusCode.UNSET)

logger = logging.getLogger(__name__)
T = TypeVar("T")

SEMCONV_VERSION: Final = "1.44.0"
"""The OpenTelemetry semantic conventions version the platform's spans and metrics follow."""
SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
INSTRUMENTATION_NAME: Final = "agent_platform"

# --- GenAI semantic-convention names (v1.44.0) ------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
ERROR_TYPE: Final = "error.type"
OP_CHAT: Final = "chat"
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_EXECUTE_TOOL: Final = "execute_tool"

# --- the platform's own attributes ------------------------------------------------------------
TENANT_ID: Final = "tenant.id"
"""The tenant's id (an int), on every span the platform starts."""
RUN_ID: Final = "agent_platform.run.id"
RUN_DEPTH: Final = "agent_platform.run.depth"
"""0 for a user's run, 1+ for a sub-run (a skill's or a sub-agent's)."""
RUN_STATUS: Final = "agent_platform.run.status"
ATTEMPT_NUMBER: Final = "agent_platform.model.attempt"
"""The attempt's number within one model call (1-based, retries and fallbacks counted)."""
ROUTE_ENTRY_INDEX: Final = "agent_platform.route.entry_index"

TRACING: bool = False
"""True once a tracer provider is installed (:func:`configure` or :func:`enable`). Read it
before building anything for a span: off, the run engine makes no span objects."""

_tracer: Any = None
_instrumented = False
_statements_instrumented = False


def endpoint_configured(environ: dict[str, str] | None = None) -> bool:
    """Whether the environment names an OTLP receiver (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, non-empty); ``OTEL_SDK_DISABLED=true`` wins."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def configure(*, service_name: str, tenant_of: Callable[[], int | None] | None = None,
              statement_spans: bool | None = None) -> bool:
    """Install tracing for this process if an OTLP endpoint is configured; else do nothing.

    Args:
        service_name: ``service.name`` of the resource (``agent-platform-web``,
            ``agent-platform-worker``); ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``
            still override it, as the SDK reads them.
        tenant_of: Returns the tenant id in context (or None); stamped on each span as it starts.
        statement_spans: Also instrument psycopg and redis (a span per SQL statement and Redis
            command); None: the ``TRACING_STATEMENT_SPANS`` setting (default off).

    Returns:
        Whether tracing is now on. Idempotent: a second call changes nothing.

    The exporter is OTLP over HTTP with protobuf (``opentelemetry-exporter-otlp-proto-http``),
    spans batched by ``BatchSpanProcessor``; Django, Celery and httpx are instrumented (psycopg
    and redis too with ``statement_spans``). ``OTEL_EXPORTER_OTLP_PROTOCOL`` other than
    ``http/protobuf`` is logged and ignored (the gRPC exporter is not installed).
    """
    if TRACING or not endpoint_configured():
        return TRACING
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol != "http/protobuf":
        logger.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported; exporting over http/protobuf", protocol)
    processors = SynchronousMultiSpanProcessor()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                              active_span_processor=processors)
    if tenant_of is not None:
        provider.add_span_processor(TenantSpanProcessor(tenant_of))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    if statement_spans is None:
        from django.conf import settings

        statement_spans = settings.TRACING_STATEMENT_SPANS
    instrument_libraries(statement_spans=statement_spans)
    enable(provider, processors)
    logger.info("tracing on: OTLP/HTTP to %s", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return True


def instrument_libraries(*, statement_spans: bool = False) -> None:
    """Instrument Django (server spans), Celery (task spans; the trace context travels in each
    message's headers) and httpx (client spans); with ``statement_spans`` also psycopg (a span
    per SQL statement) and redis (per command): about seven spans per turn of a run, ~20 % of
    the turn's CPU (bench/README.md, "Tracing cost"). Each group once per process."""
    global _instrumented, _statements_instrumented
    if not _instrumented:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.instrumentation.django import DjangoInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        DjangoInstrumentor().instrument()
        CeleryInstrumentor().instrument()
        HTTPXClientInstrumentor().instrument()
        _instrumented = True
    if statement_spans and not _statements_instrumented:
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        PsycopgInstrumentor().instrument(enable_commenter=False)
        RedisInstrumentor().instrument()
        _statements_instrumented = True


def enable(provider: Any, span_processor: SpanProcessor) -> None:
    """Trace the platform's spans through ``provider`` (an SDK ``TracerProvider``) and turn
    :data:`TRACING` on. :func:`configure` calls it; tests call it with an in-memory exporter.

    Args:
        provider: Makes the ``invoke_agent`` spans and gives the per-turn spans
            (:class:`PlatformSpan`) its sampler, id generator and resource.
        span_processor: Where the per-turn spans go when they end: the provider's own span
            processors, i.e. the ``SynchronousMultiSpanProcessor`` it was made with
            (``TracerProvider(active_span_processor=...)``, as :func:`configure` makes it), or
            its one processor when it has one (the SDK has no public reader for a provider's
            processors).
    """
    global TRACING, _tracer, _recorder
    _tracer = provider.get_tracer(INSTRUMENTATION_NAME, schema_url=SCHEMA_URL)
    _recorder = _Recorder(provider, span_processor)
    TRACING = True


def disable() -> None:
    """Turn the platform's spans off again (tests; the library instrumentations stay)."""
    global TRACING, _tracer, _recorder
    TRACING = False
    _tracer = None
    _recorder = None


def tracer() -> Any:
    """The platform's tracer (only while :data:`TRACING`).

    Raises:
        RuntimeError: tracing is off.
    """
    if _tracer is None:
        raise RuntimeError("tracing is off: check telemetry.TRACING before making spans")
    return _tracer


# --- the platform's per-turn spans ------------------------------------------------------------


class _Recorder:
    """What :class:`PlatformSpan` takes from the provider, read once in :func:`enable`: its
    sampler, id generator and resource, the span processor given to :func:`enable`, and the
    attribute value length limit (``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` or
    ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, ``None``: no limit)."""

    __slots__ = ("ids", "processor", "resource", "sampler", "scope", "value_limit")

    def __init__(self, provider: Any, processor: SpanProcessor) -> None:
        from opentelemetry.sdk.trace import SpanLimits
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.processor = processor
        self.scope = InstrumentationScope(INSTRUMENTATION_NAME, None, SCHEMA_URL)
        self.value_limit = SpanLimits().max_span_attribute_length


_recorder: _Recorder | None = None


@dataclass(slots=True, eq=False)
class PlatformSpan:
    """One of the spans a run makes per turn (``chat {model}``, ``execute_tool {tool}``),
    without the SDK's live ``Span`` object: sampled by the provider's sampler and given ids by
    its id generator as ``Tracer.start_span`` would, and handed to its span processors'
    ``on_end`` as the finished ``ReadableSpan`` the SDK's ``Span.end()`` hands them. The SDK's
    live span costs ~3 times as many instructions (a lock per span, its attribute map and
    event and link lists, each attribute cleaned one by one, the ``ReadableSpan`` copy at its
    end): bench/README.md, "Tracing cost".

    What it leaves out, by design: processors' ``on_start`` and ``_on_ending`` (the platform's
    processors act at the end only; the tenant stamp is not needed, the span starts with
    :data:`TENANT_ID`), attribute cleaning (the caller gives valid values: str, bool, int,
    float, or a tuple of one of them) and the SDK's own span metrics. The attribute value
    length limit of the environment is applied to string values at :meth:`end`.

    Use it from :func:`start_platform_span`; while its operation runs, :func:`attach_span`
    makes it the current span (children, MCP ``traceparent``), with :func:`detach` after.
    """

    name: str
    kind: Any
    """An ``opentelemetry.trace.SpanKind``."""
    context: Any
    """Its ``SpanContext``."""
    parent: Any
    """The parent's ``SpanContext``, None for a root."""
    attributes: dict[str, Any]
    start_ns: int
    recording: bool
    """False: the sampler dropped it (:meth:`end` exports nothing)."""
    status: Any = None

    def set_attribute(self, key: str, value: Any) -> None:
        """Set attribute ``key`` (a valid attribute value, see the class docstring)."""
        self.attributes[key] = value

    def set_status(self, code: Any, description: str | None = None) -> None:
        """The span's status (an ``opentelemetry.trace.StatusCode``, description for ``ERROR``)."""
        self.status = Status(code, description)

    def end(self, end_time: int | None = None) -> None:
        """Finish the span at ``end_time`` (ns since the epoch; now if None) and hand it to the
        span processors (nothing if the sampler dropped it or tracing was turned off since)."""
        recorder = _recorder
        if not self.recording or recorder is None:
            return
        attributes = self.attributes
        limit = recorder.value_limit
        if limit is not None:
            attributes = {k: v[:limit] if isinstance(v, str) else v for k, v in attributes.items()}
        recorder.processor.on_end(ReadableSpan(
            name=self.name, context=self.context, parent=self.parent, resource=recorder.resource,
            attributes=attributes, kind=self.kind, status=self.status or _UNSET,
            start_time=self.start_ns, end_time=end_time if end_time is not None else time.time_ns(),
            instrumentation_scope=recorder.scope,
        ))


def start_platform_span(name: str, kind: Any, attributes: dict[str, Any],
                        start_time: int | None = None) -> PlatformSpan:
    """A :class:`PlatformSpan` named ``name`` starting at ``start_time`` (ns since the epoch;
    now if None), a child of the current span; ``attributes`` is kept (not copied) unless the
    sampler changes it. Only while :data:`TRACING`.

    Mirrors the SDK's ``Tracer.start_span``: the trace id of the parent (a new one for a root),
    the provider's sampler (``OTEL_TRACES_SAMPLER``) deciding, the sampled and random-trace-id
    flags (W3C Trace Context level 2) on the new span's context. A span the sampler does not
    record is still a span context (its children see it as not sampled) and is never exported.

    Raises:
        RuntimeError: tracing is off.
    """
    recorder = _recorder
    if recorder is None:
        raise RuntimeError("tracing is off: check telemetry.TRACING before making spans")
    current = otel_context.get_current()
    parent = get_current_span(current).get_span_context()
    if parent.is_valid:
        trace_id = parent.trace_id
        random_trace_id = parent.trace_flags.random_trace_id
    else:
        parent = None
        trace_id = recorder.ids.generate_trace_id()
        random_trace_id = recorder.ids.is_trace_id_random()
    result = recorder.sampler.should_sample(current, trace_id, name, kind, attributes)
    flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
    if random_trace_id:
        flags |= TraceFlags.RANDOM_TRACE_ID
    context = SpanContext(trace_id, recorder.ids.generate_span_id(), is_remote=False,
                          trace_flags=TraceFlags(flags), trace_state=result.trace_state)
    sampled_attributes = result.attributes
    if len(sampled_attributes) != len(attributes):  # the sampler added some
        attributes = dict(sampled_attributes)
    return PlatformSpan(name, kind, context, parent, attributes,
                        start_time if start_time is not None else time.time_ns(), result.decision.is_recording())


def attach_span(span: PlatformSpan) -> object:
    """Make ``span`` the current span (of this task or thread) until :func:`detach` with the
    returned token: spans started meanwhile are its children, and an MCP request carries it
    as ``traceparent``."""
    return otel_context.attach(set_span_in_context(NonRecordingSpan(span.context)))


def detach(token: object) -> None:
    """Undo :func:`attach_span` (``token``: what it returned)."""
    otel_context.detach(token)


class TenantSpanProcessor(SpanProcessor):
    """A span processor that stamps :data:`TENANT_ID` on each span starting inside a tenant's
    scope (``tenant_of()`` not None) that does not carry it yet (the platform's own spans are
    started with it: no second ``set_attribute`` for them). Exports nothing itself."""

    def __init__(self, tenant_of: Callable[[], int | None]) -> None:
        self._tenant_of = tenant_of

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        attributes = span.attributes
        if attributes and TENANT_ID in attributes:
            return
        tenant_id = self._tenant_of()
        if tenant_id is not None:
            span.set_attribute(TENANT_ID, tenant_id)



def current_span_tenant(tenant_id: int) -> None:
    """Stamp ``tenant_id`` on the span current now (an HTTP request's or a Celery task's span,
    which started before the request or task knew its tenant). Nothing when tracing is off."""
    if not TRACING:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(TENANT_ID, tenant_id)


def in_caller_trace(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """``fn`` made to run in the trace context current now (the caller's), wherever it is
    awaited: an MCP pool's owner task runs each caller's call, and the mcp SDK injects the
    current span into the request's ``_meta.traceparent``. ``fn`` itself when tracing is off."""
    if not TRACING:
        return fn
    caller = otel_context.get_current()

    async def in_context(*args: Any, **kwargs: Any) -> T:
        token = otel_context.attach(caller)
        try:
            return await fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return in_context


__all__ = [
    "SCHEMA_URL", "SEMCONV_VERSION", "TENANT_ID", "TRACING", "PlatformSpan", "TenantSpanProcessor", "attach_span",
    "configure", "current_span_tenant", "detach", "disable", "enable", "endpoint_configured", "in_caller_trace",
    "instrument_libraries", "start_platform_span", "tracer",
]
