"""What a run needs, loaded once from the database at the start of (each attempt of) a run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from capabilities.builtin.kind import BuiltinBindingSpec
from capabilities.cli.kind import CliBindingSpec
from capabilities.mcp.kind import McpBindingSpec
from capabilities.registry import kind_get, specs_of
from capabilities.skills.kind import SkillBindingSpec
from llm.config import RouteEntryConfig
from llm.types import ToolSpec

__all__ = [
    "BuiltinBindingSpec", "CliBindingSpec", "McpBindingSpec", "RunRequestOptions", "RunSpec", "SkillBindingSpec",
]
"""The per-kind binding specs live with their kinds (``capabilities/*/kind.py``, ``browser/kind.py``);
those of ``capabilities`` are re-exported here for callers that name them."""


@dataclass(frozen=True, slots=True)
class RunRequestOptions:
    """What an API caller asked of one run beside the agent's configuration (``Run.request_options``,
    written by the OpenAI-compatible API, :mod:`sessions.api.openai_compat`)."""

    client_tools: tuple[ToolSpec, ...] = ()
    """Tools the caller runs itself, offered to the model beside the agent's own: a call of one
    pauses the run until the caller's next request brings its result
    (:class:`sessions.runner.interceptors.ClientToolset`)."""
    instructions: str = ""
    """Added after the agent's own system prompt for this run ("": nothing)."""
    response_format: dict[str, Any] | None = None
    """``{"type": "json_object"}`` or ``{"type": "json_schema", "name", "schema", "strict"}``: the
    answer must be JSON (valid against ``schema``); None: free text."""
    resources: tuple[dict[str, Any], ...] = ()
    """MCP resources attached to the message (the chat app's ``@``) and those pinned to the chat
    (``pinned: true``, :mod:`sessions.pinned_resources`): ``[{binding, server_id, server, uri,
    pinned?}]``, read when the run starts (:mod:`capabilities.mcp.attached`)."""
    unattended: str = ""
    """Nobody watches the run (started through the OpenAI-compatible API, A2A or agents over
    MCP): an MCP server's request for input gets this answer at once (``decline`` or
    ``cancel``, the ``MCP_ELICITATION_UNATTENDED_ANSWER`` setting) instead of pausing the run;
    "": a person answers (:mod:`capabilities.mcp.elicitation`)."""

    @classmethod
    def from_json(cls, data: dict[str, Any] | str | None) -> RunRequestOptions:
        """From the stored JSON (None or ``{}``: no options; its text, as a raw SQL read of the
        ``jsonb`` column gives it through Django's connection, is decoded)."""
        if isinstance(data, str):
            data = json.loads(data)
        data = data or {}
        tools = tuple(ToolSpec(name=t["name"], description=t.get("description", ""),
                               parameters=t.get("parameters") or {"type": "object", "properties": {}})
                      for t in data.get("client_tools") or ())
        return cls(client_tools=tools, instructions=data.get("instructions") or "",
                   response_format=data.get("response_format"), unattended=data.get("unattended") or "",
                   resources=tuple(r for r in data.get("resources") or () if isinstance(r, dict)))

    def to_json(self) -> dict[str, Any] | None:
        """The JSON stored in ``Run.request_options`` (None when there is nothing to keep)."""
        data: dict[str, Any] = {}
        if self.client_tools:
            data["client_tools"] = [{"name": t.name, "description": t.description, "parameters": t.parameters}
                                    for t in self.client_tools]
        if self.instructions:
            data["instructions"] = self.instructions
        if self.response_format is not None:
            data["response_format"] = self.response_format
        if self.unattended:
            data["unattended"] = self.unattended
        if self.resources:
            data["resources"] = list(self.resources)
        return data or None


NO_REQUEST_OPTIONS = RunRequestOptions()


@dataclass(frozen=True, slots=True)
class RunSpec:
    run_id: int
    tenant_id: int
    session_id: int
    user_id: int
    agent_name: str
    system_prompt: str
    max_loop_count: int
    tool_max_parallel: int
    tool_timeout_seconds: float
    turn_timeout_seconds: float
    """Longest one model turn (retries and fallbacks included) may take."""
    max_tokens_per_run: int | None
    """Budget: prompt + completion tokens of the whole run; None: no limit."""
    max_cost_per_run_usd_micros: int | None
    """Budget: micro-USD of the whole run; None: no limit."""
    tenant_monthly_budget_usd_micros: int | None
    """Budget: micro-USD of the tenant's LLM calls this calendar month (UTC); None: no limit."""
    entries: tuple[RouteEntryConfig, ...]
    entry_ids: tuple[int, ...]
    """ModelRouteEntry primary keys, parallel to ``entries``."""
    bindings: tuple[Any, ...] = ()
    """The agent's bound capabilities: each a binding spec of its kind (``spec.kind``), grouped
    by kind (:func:`capabilities.registry.binding_specs`). A sub-run has none (its tools are a
    subset of its parent's toolset)."""
    depth: int = 0
    """0 for a user's run; a sub-run's is its parent's + 1 (``sessions.runner.subrun``)."""
    parent_run_id: int | None = None
    """Sub-runs: the run whose tool call this one answers."""
    user_run_id: int | None = None
    """Sub-runs: the user's run (depth 0) at the top of the tree. Approvals asked inside a
    sub-run belong to it: it is the run that pauses and resumes. None for a user's run."""
    attempt: int = 1
    loop_count: int = 0
    """Model turns already taken (non-zero when resuming)."""
    run_timeout_seconds: float = 1800.0
    steer: bool = False
    """The agent's message_mode is ``steer``: messages sent meanwhile join this run between turns."""
    run_started_at: float = 0.0
    """Unix time the run first started."""
    run_paused_seconds: float = 0.0
    """Time spent waiting for approvals so far (not counted by the run timeout)."""
    agent_id: int | None = None
    """The run's agent (``AgentInstance`` id; capability kinds read it through OpenContext)."""
    request_options: RunRequestOptions = NO_REQUEST_OPTIONS
    """What the API caller asked of this run (client tools, instructions, response format)."""
    guardrails: tuple[Any, ...] = ()
    """The agent's enabled guardrails (:class:`guardrails.checks.GuardrailSpec`), in their order
    (:mod:`sessions.runner.guarding` applies them)."""
    output_schema: dict[str, Any] | None = None
    """The agent's output JSON Schema (``AgentInstance.output_schema``); None: free text."""
    output_repairs: int = 2
    """Repair turns an answer that does not match the output format gets (the agent's ``output_repairs``)."""
    routing_rules: tuple[Any, ...] = ()
    """The agent's routing rules whose route could be loaded (:class:`agents.routing.CompiledRule`, in order)."""
    routes: Any = None
    """``{route name: (entries, entry_ids)}`` of the routes the rules name (None: no rules)."""
    route_name: str = ""
    """The name of the route ``entries`` are ("" : the agent's own; else a routing rule's)."""
    record_llm_bodies: bool = False
    """The tenant keeps its model calls' request and response bodies (``Tenant.record_llm_bodies``):
    the run's router captures them (:mod:`sessions.llm_bodies`). Read with the run's
    configuration, so a change applies from the next run on."""
    purpose: str = "chat"
    """Where the run came from (``Run.purpose``, a :class:`sessions.models.RunPurpose` value; a
    sub-run has its parent's). ``evaluation``: an experiment's item, which measures the agent's
    configuration, so no user's memories are recalled into it (:mod:`memory.kind`)."""

    @property
    def output_format(self) -> dict[str, Any] | None:
        """The format the answer must have (:mod:`sessions.runner.structured_output`): the API
        caller's ``response_format`` for this run, else the agent's output schema as
        ``{"type": "json_schema", "name": "answer", "schema": ..., "strict": False}``, else None."""
        if self.request_options.response_format is not None:
            return self.request_options.response_format
        if self.output_schema is not None:
            return {"type": "json_schema", "name": "answer", "schema": self.output_schema, "strict": False}
        return None

    @property
    def attached_resources(self) -> tuple[dict[str, Any], ...]:
        """The MCP resources attached to the run's message (``request_options.resources``)."""
        return self.request_options.resources

    def bindings_of(self, kind: str) -> tuple[Any, ...]:
        """The binding specs of kind ``kind`` (``"mcp_server"``, ``"cli"``, ...), in order."""
        return specs_of(self.bindings, kind)

    @property
    def starts_subruns(self) -> bool:
        """Whether a tool of this run may start sub-runs (a bound kind with ``starts_subruns``)."""
        for b in self.bindings:
            kind = kind_get(b.kind)
            if kind is not None and kind.starts_subruns:
                return True
        return False

    @property
    def waiting_run_id(self) -> int:
        """The run that pauses while a tool call of this one waits for a human: the user's run."""
        return self.user_run_id if self.user_run_id is not None else self.run_id

    def run_seconds_left(self, now: float) -> float:
        """Seconds the run may still work (≤ 0: its run timeout has passed). ``now``: Unix time."""
        return self.run_started_at + self.run_paused_seconds + self.run_timeout_seconds - now
