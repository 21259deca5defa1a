"""The ``agent`` capability kind: another agent of the tenant (B) bound into an agent (A) as a tool.

Binding: ``config = {"agent": <B's id>, "name"?, "description"?, "input_schema"?, "handoff"?}``
and the usual approval policy.

- ``name``: the tool name the model sees (default: B's slug with ``-`` as ``_``; for a handoff,
  ``transfer_to_<that>``, as the OpenAI Agents SDK names handoff tools);
- ``description``: what the model reads (default: B's description, else "Ask the agent B.");
- ``input_schema``: a JSON Schema of the tool's arguments (an object; default ``{task: string}``).
  B's user message is the ``task`` argument when the arguments are just that, else the
  arguments as JSON;
- ``handoff``: ``true``: B takes over the conversation (see below).

A call runs B as a *sub-run* of A's run (``sessions.runner.subrun.AgentTool``): B's system
prompt, route, bindings and limits of B's published version (else its draft), resolved when A's
run loads its configuration; the budgets (tokens, cost, run deadline) are what A's run has
left. B's reply is the tool result. A handoff also makes B the chat's agent for the rest of the
session (event ``agent_handoff``) and ends A's run with B's reply.

Validation (``CapabilityBinding.clean``, hence the admin API's 400): B is an agent of the
binding's tenant ("Agent not found." otherwise, the same for another tenant's), not A itself,
and binding it does not close a cycle of agent bindings (A→B→A, or longer, over every binding
of kind ``agent`` of the tenant, enabled or not): the cycle is named in the error. Calls
deeper than ``settings.SUB_AGENT_MAX_DEPTH`` fail at run time anyway (depth limit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}\Z")
"""A tool name: the OpenAI function-name rule."""
CONFIG_KEYS = frozenset({"agent", "name", "description", "input_schema", "handoff"})

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "What the agent should do, with every detail it needs: it sees nothing of this conversation.",
        },
    },
    "required": ["task"],
    "additionalProperties": False,
}
"""The default input schema of a sub-agent tool: one ``task`` string."""


@dataclass(frozen=True, slots=True)
class AgentBindingSpec:
    """An ``agent`` binding, as a run needs it."""

    kind: ClassVar[str] = "agent"
    agent_id: int
    """B: the agent the tool runs."""
    agent_name: str
    version_id: int | None
    """B's version the sub-run runs: its published one, else its draft (None: B has none)."""
    name: str
    """The tool name asked for (before collision renaming)."""
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: dict(TASK_SCHEMA))
    handoff: bool = False
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


def _agent_model() -> Any:
    from django.apps import apps

    return apps.get_model("agents", "AgentInstance")


def config_agent_id(config: Any) -> int | None:
    """``config["agent"]`` when it is a positive integer, else None."""
    value = config.get("agent") if isinstance(config, dict) else None
    return value if type(value) is int and value > 0 else None


def default_tool_name(slug: str, *, handoff: bool) -> str:
    """``research-bot`` → ``research_bot`` (``transfer_to_research_bot`` for a handoff), cut to 64."""
    base = slug.replace("-", "_") or "agent"
    return (f"transfer_to_{base}" if handoff else base)[:64]


def agent_edges(tenant_id: int, *, excluding_binding: int | None = None) -> dict[int, set[int]]:
    """``{agent id: {agent ids it binds with kind agent}}`` over every ``agent`` binding of the
    tenant (enabled or not), but ``excluding_binding``."""
    from django.apps import apps

    binding_model = apps.get_model("agents", "CapabilityBinding")
    rows = binding_model.all_tenants.filter(tenant_id=tenant_id, kind=AgentKind.key)
    if excluding_binding is not None:
        rows = rows.exclude(pk=excluding_binding)
    edges: dict[int, set[int]] = {}
    for agent_id, config in rows.values_list("agent_id", "config"):
        target = config_agent_id(config)
        if target is not None:
            edges.setdefault(agent_id, set()).add(target)
    return edges


def cycle_through(edges: dict[int, set[int]], *, start: int, target: int) -> list[int] | None:
    """The path ``target → … → start`` in ``edges`` (so the new edge ``start → target`` closes a
    cycle), or None. Breadth first: the shortest such path."""
    previous: dict[int, int | None] = {target: None}
    queue = [target]
    while queue:
        node = queue.pop(0)
        if node == start:
            path = [node]
            while previous[path[-1]] is not None:
                path.append(previous[path[-1]])  # type: ignore[arg-type]
            return list(reversed(path))
        for nxt in sorted(edges.get(node, ())):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


def _schema_problem(schema: Any) -> str:
    """What is wrong with ``schema`` as a tool's input schema ("" when fine)."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, dict) or schema.get("type") != "object":
        return 'An input schema is a JSON Schema of type object: {"type": "object", "properties": {...}}.'
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        return f"Not a valid JSON Schema: {exc.message}"
    return ""


class AgentKind(CapabilityKind):
    """Bindings of kind ``agent``: a sub-agent (or a handoff) as a tool."""

    key = "agent"
    label = "Agent (sub-agent or handoff)"
    fields = ("config", "approval_policy")
    starts_subruns = True
    position = 55

    def validate(self, binding: Any) -> dict[str, Any]:
        """The config's keys and types, B in the binding's tenant, not A itself, and no cycle."""
        config = binding.config
        target = config_agent_id(config)
        if target is None:
            return {"config": 'Name the agent to bind: {"agent": <id>} (GET /api/v1/admin/agents/).'}
        problem = self._config_problem(config)
        if problem:
            return {"config": problem}
        agents = _agent_model().all_tenants.filter(tenant_id=binding.tenant_id)
        if not binding.tenant_id or not agents.filter(pk=target).exists():
            return {"config": "Agent not found."}
        if binding.agent_id and target == binding.agent_id:
            return {"config": "An agent cannot be bound into itself."}
        if binding.agent_id:
            path = cycle_through(agent_edges(binding.tenant_id, excluding_binding=binding.pk),
                                 start=binding.agent_id, target=target)
            if path is not None:
                names = dict(agents.filter(pk__in=path).values_list("pk", "name"))
                chain = " → ".join(names.get(pk, str(pk)) for pk in [binding.agent_id, *path])
                return {"config": f"This binding would make a cycle of agents calling agents: {chain}."}
        return {}

    @staticmethod
    def _config_problem(config: dict[str, Any]) -> str:
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            return f"Unknown keys {unknown}: use agent, name, description, input_schema, handoff."
        name = config.get("name")
        if name is not None and (not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name)):
            return "name: letters, digits, '_' and '-' (at most 64)."
        if "description" in config and not isinstance(config["description"], str):
            return "description: a string."
        if "handoff" in config and not isinstance(config["handoff"], bool):
            return "handoff: true or false."
        if config.get("input_schema") is not None:
            problem = _schema_problem(config["input_schema"])
            if problem:
                return f"input_schema: {problem}"
        return ""

    def spec_key(self, binding: Any) -> Any:
        config = binding.config if isinstance(binding.config, dict) else {}
        return (config_agent_id(config), bool(config.get("handoff")))

    def load_spec(self, binding: Any) -> AgentBindingSpec | None:
        """B as a tool; None when B is gone or inactive, or is the run's own agent."""
        config = binding.config if isinstance(binding.config, dict) else {}
        target = config_agent_id(config)
        agent = _agent_model().all_tenants.filter(pk=target, tenant_id=binding.tenant_id, is_active=True).first()
        if agent is None or agent.pk == binding.agent_id:
            return None
        handoff = config.get("handoff") is True
        description = config.get("description") or agent.description or f"Ask the agent {agent.name}."
        if handoff and not config.get("description"):
            description = f"Hand the conversation over to the agent {agent.name}: {description}"
        return AgentBindingSpec(
            agent_id=agent.pk, agent_name=agent.name,
            version_id=agent.published_version_id or agent.draft_version_id,
            name=config.get("name") or default_tool_name(agent.slug, handoff=handoff),
            description=description, parameters=config.get("input_schema") or dict(TASK_SCHEMA),
            handoff=handoff, binding_id=binding.pk, approval_policy=tuple(binding.approval_policy),
        )

    async def open_toolset(self, specs: Sequence[AgentBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        """One tool per bound agent, made by the runner (``OpenContext.subrun_tool``)."""
        if ctx.subrun_tool is None:
            raise RuntimeError("sub-agents need a runner that provides OpenContext.subrun_tool")
        make = ctx.subrun_tool
        return [
            (b, KindToolset(sources=[ToolSource(
                origin=ToolOrigin(source="agent", name=b.name),
                factory=lambda exposed, b=b: make(b, exposed),
            )]))
            for b in specs
        ]


kind_register(AgentKind())
