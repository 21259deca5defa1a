"""A run's spans (OpenTelemetry GenAI conventions) and model-call metrics, from three hooks.

- :func:`run_traced`: ``invoke_agent {agent}`` around a run's loop, a sub-run's included (its
  span is a child of the ``execute_tool`` span of the call that started it);
- :class:`AttemptObserver` (the router's ``record`` callback, wrapped by
  :func:`sessions.runner.adapters.router_model`): one ``chat {model}`` span per attempt of a
  model call, so retries and fallbacks show as sibling spans (``error.type`` on the failed
  ones), and the ``gen_ai_client_*`` metrics (:mod:`agent_platform.metrics`) whether or not
  tracing is on; the model's stream itself is never wrapped;
- :class:`TracingToolset` (one of :data:`sessions.runner.interceptors.INTERCEPTORS`):
  ``execute_tool {tool}`` around each call that runs. An MCP call made inside it carries the
  span's ``traceparent`` in its ``_meta`` (the mcp SDK injects it; the pooled session's owner
  task runs the call in the caller's trace context: :func:`agent_platform.telemetry.in_caller_trace`).

With tracing off (:data:`agent_platform.telemetry.TRACING` false) no span object is made:
:func:`run_traced` returns the loop's coroutine itself, the toolset passes calls straight
through, and the observer only counts metrics.

Message content (the run's input and answer, tool arguments and results) goes on spans only
for a tenant with ``Tenant.trace_content`` (read once a minute per tenant and process). A
tenant that also keeps its model call records (``Tenant.record_llm_bodies``) gets each model
call's bodies on its ``chat`` span as ``gen_ai.input.messages`` / ``gen_ai.output.messages``
(:mod:`llm.genai_content`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.trace import SpanKind, StatusCode

from agent_platform import metrics, telemetry
from capabilities.toolsets import SUCCEEDED, ToolInvocation, ToolOutcome, WrapperToolset
from llm.genai_content import input_messages, output_messages
from llm.records import AttemptRecord, BodyCapture
from sessions.runner.spec import RunSpec
from sessions.runner.threads import db

CONTENT_MAX_CHARS = 16_000
"""Longest message content put on a span attribute (the rest is cut)."""
BODY_CONTENT_MAX_CHARS = 128_000
"""Longest ``gen_ai.input.messages`` of a ``chat`` span from a model call's request body: the
system messages and the latest messages that fit (each text cut at :data:`CONTENT_MAX_CHARS`)."""
CONTENT_CACHE_SECONDS = 60.0
"""How long a tenant's ``trace_content`` choice is kept per process."""

_content_cache: dict[int, tuple[float, bool]] = {}


def _trace_content_read(tenant_id: int) -> bool:
    from tenants.models import Tenant

    return bool(Tenant.objects.filter(pk=tenant_id).values_list("trace_content", flat=True).first())


async def trace_content_allowed(tenant_id: int) -> bool:
    """Whether tenant ``tenant_id`` opted in to message content on its spans (cached
    :data:`CONTENT_CACHE_SECONDS`; a failed read means no)."""
    now = time.monotonic()
    cached = _content_cache.get(tenant_id)
    if cached is not None and cached[0] > now:
        return cached[1]
    try:
        allowed = await db(_trace_content_read)(tenant_id)
    except Exception:  # noqa: BLE001 - content is optional; the run must not fail for it
        allowed = False
    _content_cache[tenant_id] = (now + CONTENT_CACHE_SECONDS, allowed)
    return allowed


def _cut(text: str) -> str:
    return text if len(text) <= CONTENT_MAX_CHARS else text[:CONTENT_MAX_CHARS] + "…"


def _messages_json(role: str, text: str) -> str:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages`` of one text message (the
    conventions' JSON shape: ``[{role, parts: [{type: text, content}]}]``)."""
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": _cut(text)}]}], ensure_ascii=False)


def _run_input_read(run_id: int) -> str:
    from sessions.models import Message

    # tenant-bypass: reads one run's own input inside its tenant scope (the run loop's task).
    row = Message.objects.filter(run_id=run_id, role="user").order_by("position").values_list("content", flat=True)
    return "\n\n".join(row)


# --- invoke_agent -----------------------------------------------------------------------------


def run_traced(spec: RunSpec, loop: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
    """The run loop ``loop`` of run ``spec``, inside an ``invoke_agent {agent}`` span when
    tracing is on; ``loop`` itself when it is off (no span, no extra frame)."""
    if not telemetry.TRACING:
        return loop
    return _in_agent_span(spec, loop)


def _agent_attributes(spec: RunSpec) -> dict[str, Any]:
    return {
        telemetry.GEN_AI_OPERATION_NAME: telemetry.OP_INVOKE_AGENT,
        telemetry.GEN_AI_AGENT_NAME: spec.agent_name,
        telemetry.GEN_AI_AGENT_ID: str(spec.agent_id or ""),
        telemetry.GEN_AI_CONVERSATION_ID: str(spec.session_id),
        telemetry.GEN_AI_PROVIDER_NAME: spec.entries[0].api if spec.entries else "",
        telemetry.GEN_AI_REQUEST_MODEL: spec.entries[0].model if spec.entries else "",
        telemetry.TENANT_ID: spec.tenant_id,
        telemetry.RUN_ID: spec.run_id,
        telemetry.RUN_DEPTH: spec.depth,
    }


async def _in_agent_span(spec: RunSpec, loop: Coroutine[Any, Any, Any]) -> Any:
    content = await trace_content_allowed(spec.tenant_id)
    tracer = telemetry.tracer()
    with tracer.start_as_current_span(f"{telemetry.OP_INVOKE_AGENT} {spec.agent_name}", kind=SpanKind.INTERNAL,
                                      attributes=_agent_attributes(spec), record_exception=False,
                                      set_status_on_exception=False) as span:
        if content:
            span.set_attribute(telemetry.GEN_AI_INPUT_MESSAGES,
                               _messages_json("user", await db(_run_input_read)(spec.run_id)))
        try:
            outcome = await loop
        except asyncio.CancelledError:
            span.set_attribute(telemetry.RUN_STATUS, "cancelled")
            raise
        except Exception as exc:
            span.set_attribute(telemetry.ERROR_TYPE, type(exc).__name__)
            span.set_status(StatusCode.ERROR, str(exc)[:500])
            raise
        status = str(getattr(outcome, "status", ""))
        span.set_attribute(telemetry.RUN_STATUS, status)
        if status == "failed":
            span.set_attribute(telemetry.ERROR_TYPE, str(getattr(outcome, "reason", "")) or "failed")
            span.set_status(StatusCode.ERROR, str(getattr(outcome, "error", ""))[:500])
        reply = getattr(outcome, "reply", "")
        if content and reply:
            span.set_attribute(telemetry.GEN_AI_OUTPUT_MESSAGES, _messages_json("assistant", reply))
        return outcome


# --- chat (model calls) -----------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _server_address(base_url: str) -> tuple[str, int | None]:
    """``(server.address, server.port)`` of a route entry's base URL (cached: a run's entries repeat)."""
    parts = urlsplit(base_url)
    return parts.hostname or "", parts.port


class AttemptObserver:
    """The router's ``record`` callback around the run's own (``record``): each attempt of a
    model call observed in the ``gen_ai_client_*`` metrics and, when tracing, as a ``chat
    {model}`` span timed from the attempt's record (start = end − latency), made and ended at
    once: a succeeded attempt's record carries its answer's finish reason and response model
    (:class:`~llm.records.AttemptRecord`), so nothing wraps the model's stream."""

    __slots__ = ("_record", "_spec", "operation")

    def __init__(self, spec: RunSpec, record: Callable[[AttemptRecord], Awaitable[None]] | None) -> None:
        self._spec = spec
        self._record = record
        self.operation = telemetry.OP_CHAT

    async def __call__(self, attempt: AttemptRecord) -> None:
        entry = self._spec.entries[attempt.entry_index] if attempt.entry_index < len(self._spec.entries) else None
        provider = entry.api if entry is not None else ""
        metrics.model_attempt_observe(attempt, provider=provider, operation=self.operation)
        if telemetry.TRACING:
            content = None
            if attempt.bodies is not None and await trace_content_allowed(self._spec.tenant_id):
                content = body_content(attempt.bodies)
            self._span(attempt, entry, provider, content)
        if self._record is not None:
            await self._record(attempt)

    def _span(self, attempt: AttemptRecord, entry: Any, provider: str, content: dict[str, str] | None = None) -> None:
        end_ns = time.time_ns()
        attributes: dict[str, Any] = {
            telemetry.GEN_AI_OPERATION_NAME: self.operation,
            telemetry.GEN_AI_PROVIDER_NAME: provider,
            telemetry.GEN_AI_REQUEST_MODEL: attempt.model,
            telemetry.GEN_AI_CONVERSATION_ID: str(self._spec.session_id),
            telemetry.GEN_AI_USAGE_INPUT_TOKENS: attempt.prompt_tokens,
            telemetry.GEN_AI_USAGE_OUTPUT_TOKENS: attempt.completion_tokens,
            telemetry.TENANT_ID: self._spec.tenant_id,
            telemetry.RUN_ID: self._spec.run_id,
            telemetry.ATTEMPT_NUMBER: attempt.attempt,
            telemetry.ROUTE_ENTRY_INDEX: attempt.entry_index,
        }
        if entry is not None:
            host, port = _server_address(entry.base_url)
            attributes["server.address"] = host
            if port is not None:
                attributes["server.port"] = port
        if attempt.first_token_ms is not None:
            attributes[telemetry.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = attempt.first_token_ms / 1000
        failed = attempt.status != "succeeded"
        if failed:
            attributes[telemetry.ERROR_TYPE] = attempt.error_class or "other"
        else:
            attributes[telemetry.GEN_AI_RESPONSE_FINISH_REASONS] = (attempt.finish_reason or "stop",)
            if attempt.response_model:
                attributes[telemetry.GEN_AI_RESPONSE_MODEL] = attempt.response_model
        if content:
            attributes.update(content)
        span = telemetry.start_platform_span(f"{self.operation} {attempt.model}", SpanKind.CLIENT, attributes,
                                             start_time=end_ns - attempt.latency_ms * 1_000_000)
        if failed:
            span.set_status(StatusCode.ERROR, attempt.error[:500])
        span.end(end_time=end_ns)


def body_content(bodies: BodyCapture) -> dict[str, str]:
    """A model call's bodies as its ``chat`` span's content attributes:
    ``{gen_ai.input.messages, gen_ai.output.messages}`` (JSON text in the GenAI conventions'
    shape, :mod:`llm.genai_content`; the output only when an answer came), the entry's key
    redacted as in the stored record. A body that cannot be read gives no attribute."""
    request: Any = bodies.request
    if isinstance(request, str):
        try:
            request = json.loads(request)
        except ValueError:
            request = None
    out: dict[str, str] = {}
    if isinstance(request, dict):
        out[telemetry.GEN_AI_INPUT_MESSAGES] = _latest_that_fit(input_messages(request, max_chars=CONTENT_MAX_CHARS))
    if isinstance(bodies.response, dict):
        out[telemetry.GEN_AI_OUTPUT_MESSAGES] = json.dumps(output_messages(bodies.response, max_chars=CONTENT_MAX_CHARS),
                                                           ensure_ascii=False)
    for secret in bodies.secrets:
        if secret and len(secret) >= 8:
            out = {name: value.replace(secret, "[redacted]") for name, value in out.items()}
    return out


def _latest_that_fit(messages: list[dict[str, Any]]) -> str:
    """``messages`` as JSON within :data:`BODY_CONTENT_MAX_CHARS`: the system messages and the
    latest others that fit (the oldest dropped first)."""
    text = json.dumps(messages, ensure_ascii=False)
    if len(text) <= BODY_CONTENT_MAX_CHARS:
        return text
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    size = len(json.dumps(system, ensure_ascii=False))
    kept: list[dict[str, Any]] = []
    for message in reversed(rest):
        size += len(json.dumps(message, ensure_ascii=False)) + 2
        if size > BODY_CONTENT_MAX_CHARS and kept:
            break
        kept.append(message)
    return json.dumps([*system, *reversed(kept)], ensure_ascii=False)


def model_observed(spec: RunSpec, record: Any, build: Callable[[Any], Any]) -> Any:
    """The run's model: ``build(record_callback)`` (the router) with its attempts observed
    (:class:`AttemptObserver`: metrics always, ``chat`` spans while tracing)."""
    return build(AttemptObserver(spec, record))


# --- execute_tool -----------------------------------------------------------------------------


class TracingToolset(WrapperToolset):
    """``execute_tool {tool}`` around each call that gets this far (after the client-tool and
    approval-policy wrappers: a call waiting for a human or the API client has no span until
    it runs). ``error.type``: the outcome's code (``timeout``, ``mcp_tool_error``, ...) when it
    failed. Arguments and result only for a tenant that opted in to content."""

    async def call_tool(self, call: ToolInvocation) -> ToolOutcome:
        if not telemetry.TRACING:
            return await self.wrapped.call_tool(call)
        return await _traced_call(self.wrapped, call)


async def _traced_call(wrapped: Any, call: ToolInvocation) -> ToolOutcome:
    context = call.context
    origin = call.origin
    attributes: dict[str, Any] = {
        telemetry.GEN_AI_OPERATION_NAME: telemetry.OP_EXECUTE_TOOL,
        telemetry.GEN_AI_TOOL_NAME: call.name,
        telemetry.GEN_AI_TOOL_CALL_ID: str(context.tool_call_id),
        telemetry.GEN_AI_TOOL_TYPE: "function",
        telemetry.TENANT_ID: context.tenant_id,
        telemetry.RUN_ID: context.run_id,
        telemetry.GEN_AI_CONVERSATION_ID: str(context.session_id),
    }
    if origin is not None:
        attributes["agent_platform.tool.source"] = origin.source
    content = await trace_content_allowed(context.tenant_id)
    if content and call.arguments is not None:
        attributes[telemetry.GEN_AI_TOOL_CALL_ARGUMENTS] = _cut(json.dumps(call.arguments, ensure_ascii=False))
    span = telemetry.start_platform_span(f"{telemetry.OP_EXECUTE_TOOL} {call.name}", SpanKind.INTERNAL, attributes)
    token = telemetry.attach_span(span)
    try:
        outcome = await wrapped.call_tool(call)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            span.set_attribute(telemetry.ERROR_TYPE, "cancelled")
        elif isinstance(exc, Exception):  # a wait for a human (approval, question, sub-run) or a bug below
            span.set_attribute("agent_platform.tool_call.raised", type(exc).__name__)
        span.end()
        raise
    finally:
        telemetry.detach(token)
    if outcome.status != SUCCEEDED:
        span.set_attribute(telemetry.ERROR_TYPE, outcome.code or outcome.status)
        span.set_status(StatusCode.ERROR, outcome.error[:500])
    elif content:
        span.set_attribute(telemetry.GEN_AI_TOOL_CALL_RESULT, _cut(outcome.content))
    span.end()
    return outcome


__all__ = [
    "AttemptObserver", "TracingToolset", "body_content", "model_observed", "run_traced",
    "trace_content_allowed",
]
