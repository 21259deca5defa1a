"""The ``a2a`` capability kind: a remote A2A agent (:class:`~capabilities.a2a.models.A2aAgent`)
as one tool of our agents.

Binding: ``config = {"a2a_agent": <id>}`` (a remote agent of the binding's tenant) and the
usual approval policy. When a run opens its tools, the agent's card is fetched (its
credentials sent, every connect address-checked: :mod:`capabilities.a2a.http`) and stored on
the row; a card that cannot be fetched or read leaves the tool out of the run with a
``capability_unavailable`` event. The tool: named after the card's skill (one skill: its
``id``; else the card's ``name``), described by the card's description and its skills, input
``{message}``. A call sends the message with the a2a-sdk client (streaming when the card says
so: each status and chunk is a ``tool_call_progress`` event, shown on the tool card; else one
blocking call) and answers with the remote task's text (its artifacts' text parts, else its
status message) plus a line per file artifact (its URL); structured data: the task's id,
context, state and artifacts. A failed, rejected or cancelled task, an A2A error, an HTTP
error or the timeout is a failed tool call with the reason. The result is framed as untrusted
(an outside agent wrote it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource
from llm.types import ToolSpec

logger = logging.getLogger(__name__)

CARD_TIMEOUT_SECONDS = 15.0
"""Seconds for fetching a card when a run opens its tools."""
MAX_CARD_BYTES = 256 * 1024
"""A larger card is refused (a card is a few KB)."""
MAX_DESCRIPTION = 1024
"""Characters of the tool description (as MCP tool descriptions are capped)."""
MAX_RESULT_CHARS = 100_000
"""Characters of the remote agent's text kept for the model."""
_FINAL_OK = {"TASK_STATE_COMPLETED"}
_FINAL_BAD = {"TASK_STATE_FAILED", "TASK_STATE_REJECTED", "TASK_STATE_CANCELED"}
_WAITING = {"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"}


@dataclass(frozen=True, slots=True)
class A2aBindingSpec:
    """An ``a2a`` binding, as a run needs it (credentials decrypted: never log it)."""

    kind: ClassVar[str] = "a2a"
    agent_id: int
    name: str
    card_url: str
    headers: tuple[tuple[str, str], ...]
    call_timeout_seconds: float
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


def _config_agent_id(binding: Any) -> int | None:
    value = (binding.config or {}).get("a2a_agent") if isinstance(binding.config, dict) else None
    return value if type(value) is int and value > 0 else None


class A2aKind(CapabilityKind):
    """Bindings of kind ``a2a``."""

    key = "a2a"
    label = "Remote A2A agent"
    fields = ("config", "approval_policy")
    position = 15

    def validate(self, binding: Any) -> dict[str, Any]:
        """``config.a2a_agent`` names a remote A2A agent of the binding's tenant."""
        from capabilities.a2a.models import A2aAgent

        agent_id = _config_agent_id(binding)
        if agent_id is None:
            return {"config": 'Name the remote A2A agent: {"a2a_agent": <id>} (GET /api/v1/admin/a2a-agents/).'}
        if not A2aAgent.all_tenants.filter(pk=agent_id, tenant_id=binding.tenant_id).exists():
            return {"config": "Remote A2A agent not found."}
        return {}

    def spec_key(self, binding: Any) -> int | None:
        return _config_agent_id(binding)

    def load_spec(self, binding: Any) -> A2aBindingSpec | None:
        from capabilities.a2a.models import A2aAgent
        from capabilities.a2a.services import a2a_agent_headers

        agent = A2aAgent.objects.select_related("tenant").filter(pk=_config_agent_id(binding)).first()
        if agent is None or not agent.enabled:
            return None
        return A2aBindingSpec(
            agent_id=agent.pk, name=agent.name, card_url=agent.card_url,
            headers=tuple(sorted(a2a_agent_headers(agent).items())), call_timeout_seconds=agent.call_timeout_seconds,
            binding_id=binding.pk, approval_policy=tuple(binding.approval_policy))

    async def open_toolset(self, specs: Sequence[A2aBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        """Each agent's card fetched (concurrently); an agent whose card fails is left out
        (``capability_unavailable`` ``{source: "a2a", alias, error}``)."""
        cards = await asyncio.gather(*(_card(spec) for spec in specs), return_exceptions=True)
        opened = []
        for spec, card in zip(specs, cards, strict=True):
            error = card.message if isinstance(card, ToolError) else None
            if isinstance(card, BaseException) and error is None:
                raise card
            await _record(ctx, spec, None if error else card, error or "")
            if error:
                logger.warning("run %s: A2A agent %r left out: %s", ctx.run_id, spec.name, error)
                if ctx.publish is not None:
                    await ctx.publish("capability_unavailable", {
                        "source": "a2a", "alias": spec.name,
                        "error": f"Remote A2A agent {spec.name!r} is unavailable: {error}"[:2000]})
                continue
            timeout = min(spec.call_timeout_seconds, ctx.tool_timeout_seconds or spec.call_timeout_seconds)
            opened.append((spec, KindToolset(sources=[ToolSource(
                origin=ToolOrigin(source="a2a", name=tool_name(card)),
                factory=lambda exposed, s=spec, c=card, t=timeout: A2aTool(s, c, exposed, timeout_seconds=t))])))
        return opened


async def _record(ctx: OpenContext, spec: A2aBindingSpec, card: Any, error: str) -> None:
    from google.protobuf.json_format import MessageToDict

    from capabilities.a2a.services import a2a_agent_card_record

    if ctx.in_thread is None:
        return
    try:
        await ctx.in_thread(a2a_agent_card_record)(tenant_id=ctx.tenant_id, agent_id=spec.agent_id,
                                                   card=MessageToDict(card) if card is not None else None, error=error)
    except Exception:  # the snapshot is for the console; the run goes on without it
        logger.exception("run %s: could not store the card of A2A agent %s", ctx.run_id, spec.agent_id)


async def _card(spec: A2aBindingSpec) -> Any:
    """The agent's ``AgentCard`` (the a2a-sdk's parser: a 1.0 or 0.3 card).

    Raises:
        ToolError: ``unavailable`` with the reason (refused address, HTTP error, not a card).
    """
    import httpx
    from a2a.client.card_resolver import parse_agent_card

    from capabilities.a2a.http import checked_client

    try:
        async with checked_client(dict(spec.headers), CARD_TIMEOUT_SECONDS) as client, \
                client.stream("GET", spec.card_url, headers={"Accept": "application/json"}) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_CARD_BYTES:
                    raise ToolError(f"The agent card is larger than {MAX_CARD_BYTES} bytes.", code="unavailable")
            status = response.status_code
    except httpx.HTTPError as exc:
        raise ToolError(f"Cannot fetch the agent card: {exc or type(exc).__name__}", code="unavailable") from exc
    if status != 200:
        raise ToolError(f"Fetching the agent card answered HTTP {status}.", code="unavailable")
    try:
        return parse_agent_card(json.loads(bytes(body)))
    except Exception as exc:  # json or protobuf parse errors: not a card
        raise ToolError(f"The agent card is not a valid A2A card: {exc}"[:500], code="unavailable") from exc


def tool_name(card: Any) -> str:
    """The tool's own name: the card's one skill's ``id``, else the card's ``name`` (as a tool
    name: ``[a-z0-9_-]``, at most 48 characters; ``a2a_agent`` when nothing is left)."""
    raw = card.skills[0].id if len(card.skills) == 1 and card.skills[0].id else card.name
    name = re.sub(r"[^a-z0-9_-]+", "_", raw.lower()).strip("_-")[:48]
    return name or "a2a_agent"


def tool_description(card: Any) -> str:
    """The card's description and its skills (name: description), capped at :data:`MAX_DESCRIPTION`."""
    lines = [f"Ask the remote agent {card.name!r}: {card.description}".strip()]
    for skill in card.skills:
        lines.append(f"- {skill.name}: {skill.description}".strip())
    lines.append("Send it a message in plain language; its answer is the result.")
    text = "\n".join(lines)
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


class A2aTool(Tool):
    """A remote A2A agent as a tool: ``{message}`` in, its answer out (module docstring)."""

    untrusted = True  # an outside agent wrote the result

    def __init__(self, spec: A2aBindingSpec, card: Any, exposed_name: str, *, timeout_seconds: float) -> None:
        self.binding = spec
        self.card = card
        self.timeout_seconds = timeout_seconds
        self.spec = ToolSpec(name=exposed_name, description=tool_description(card), parameters={
            "type": "object", "properties": {"message": {"type": "string", "description": "What to ask the agent."}},
            "required": ["message"], "additionalProperties": False})

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Send ``arguments["message"]`` and answer with the remote task's result.

        Raises:
            ToolError: ``invalid_arguments``; ``a2a_error`` (the task failed, an A2A or HTTP
                error); ``timeout``.
        """
        message = arguments.get("message")
        if not isinstance(message, str) or not message.strip():
            raise ToolError("Pass the message to send as a non-empty string: {\"message\": \"...\"}.",
                            code="invalid_arguments")
        try:
            async with asyncio.timeout(self.timeout_seconds):
                return await self._call(message, context)
        except TimeoutError as exc:
            raise ToolError(f"The remote agent {self.binding.name!r} did not answer within "
                            f"{self.timeout_seconds:g} s.", code="timeout") from exc

    async def _call(self, text: str, context: ToolContext) -> ToolResult:
        import httpx
        from a2a.client import ClientConfig, ClientFactory
        from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
        from a2a.utils.constants import TransportProtocol
        from a2a.utils.errors import A2AError

        from capabilities.a2a.http import checked_client

        streaming = bool(self.card.capabilities.streaming)
        request = SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                                     parts=[Part(text=text)]))
        watch = _Watch(context)
        async with checked_client(dict(self.binding.headers), self.timeout_seconds) as http:
            config = ClientConfig(httpx_client=http, streaming=streaming,
                                  supported_protocol_bindings=[TransportProtocol.JSONRPC, TransportProtocol.HTTP_JSON])
            try:
                client = ClientFactory(config).create(self.card)
            except ValueError as exc:
                raise ToolError(f"The remote agent offers no binding we speak: {exc}", code="a2a_error") from exc
            try:
                async for event in client.send_message(request):
                    await watch.event(event)
            except A2AError as exc:
                raise ToolError(f"The remote agent answered an error: {exc}"[:2000], code="a2a_error") from exc
            except httpx.HTTPError as exc:
                raise ToolError(f"Cannot reach the remote agent: {exc or type(exc).__name__}"[:2000],
                                code="a2a_error") from exc
            finally:
                await client.close()
        return watch.result(self.binding.name)


def _text(parts: Any) -> str:
    return "".join(p.text for p in parts if p.WhichOneof("content") == "text")


class _Watch:
    """What a call's events came to: the task's state, its artifacts (chunks appended) and
    its status message; each event a ``tool_call_progress`` event."""

    def __init__(self, context: ToolContext) -> None:
        self.context = context
        self.task_id = self.context_id = ""
        self.state = ""
        self.status_text = ""
        self.artifacts: dict[str, dict[str, Any]] = {}
        self.chars = 0

    async def event(self, event: Any) -> None:
        kind = event.WhichOneof("payload")
        if kind == "task":
            self._task(event.task)
            await self.context.progress(f"Remote task {self.task_id}: {_state(self.state)}")
        elif kind == "message":
            self.state = "TASK_STATE_COMPLETED"
            self.status_text = _text(event.message.parts)
        elif kind == "status_update":
            self.task_id = self.task_id or event.status_update.task_id
            self._status(event.status_update.status)
            await self.context.progress(f"Remote task {self.task_id}: {_state(self.state)}")
        elif kind == "artifact_update":
            update = event.artifact_update
            self._artifact(update.artifact, append=update.append)
            await self.context.progress(f"{self.chars} characters received")

    def _task(self, task: Any) -> None:
        self.task_id, self.context_id = task.id, task.context_id
        self._status(task.status)
        self.artifacts.clear()
        for artifact in task.artifacts:
            self._artifact(artifact, append=False)

    def _status(self, status: Any) -> None:
        from a2a.types.a2a_pb2 import TaskState

        self.state = TaskState.Name(status.state)
        if status.HasField("message"):
            self.status_text = _text(status.message.parts)

    def _artifact(self, artifact: Any, *, append: bool) -> None:
        entry = self.artifacts.setdefault(artifact.artifact_id, {"id": artifact.artifact_id, "name": artifact.name,
                                                                 "text": "", "urls": []})
        if not append:
            entry.update(text="", urls=[])
        text = _text(artifact.parts)
        entry["text"] += text
        entry["urls"] += [p.url for p in artifact.parts if p.WhichOneof("content") == "url"]
        self.chars += len(text)

    def _text(self) -> str:
        """The answer's text: the artifacts' text (else the status message), prefixed with the
        state when the task did not complete (waiting for input, or still working)."""
        text = "\n\n".join(a["text"] for a in self.artifacts.values() if a["text"]) or self.status_text
        if self.state in _WAITING:
            return f"The remote agent needs more input ({_state(self.state)}): {self.status_text or text}"
        if self.state not in _FINAL_OK:
            return f"The remote task is {_state(self.state) or 'unknown'}: {text}"
        return text

    def result(self, name: str) -> ToolResult:
        """The call's :class:`ToolResult` (text, file links, ``{task_id, context_id, state, artifacts}``).

        Raises:
            ToolError: ``a2a_error`` for a failed, rejected or cancelled task (with its status message).
        """
        if self.state in _FINAL_BAD:
            why = self.status_text or "no reason given"
            raise ToolError(f"The remote agent {name!r} ended the task {_state(self.state)}: {why}"[:2000],
                            code="a2a_error")
        files = [f"[{a['name'] or a['id']}]({url})" for a in self.artifacts.values() for url in a["urls"]]
        content = "\n".join([self._text()[:MAX_RESULT_CHARS], *files]).strip() or "(The remote agent answered nothing.)"
        return ToolResult(content=content, data={
            "task_id": self.task_id, "context_id": self.context_id, "state": self.state,
            "artifacts": [{"id": a["id"], "name": a["name"], "urls": a["urls"]} for a in self.artifacts.values()]})


def _state(name: str) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` → ``input-required``."""
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")


kind_register(A2aKind())
