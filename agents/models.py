"""Agent instances and the capabilities bound to them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils.text import slugify

# Re-exported: the first rule whose pattern matches any of the names decides; ``allow`` if none
# (the runner's approval wrapper uses the same function).
from capabilities.toolsets import approval_action  # noqa: F401
from tenants.models import Membership, Role
from tenants.scoping import TenantOwnedModel

SLUG_MAX_LENGTH = 64
"""An agent's slug names it in the OpenAI-compatible API (``model``), as an MCP tool and in A2A
paths: 64 characters fits all three (MCP tool names: 1-128 characters of ``[A-Za-z0-9_.-]``,
MCP specification 2025-11-25, "Tool names"; OpenAI function names: at most 64)."""

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9_-]*\Z",
    "Use lowercase letters, digits, '-' and '_', starting with a letter or a digit.",
    code="invalid_slug",
)


def agent_slug_from_name(name: str, taken: set[str]) -> str:
    """A slug for an agent called ``name`` that is not in ``taken`` (the tenant's other slugs).

    ``slugify(name)`` (ASCII, lowercase, hyphens) cut to fit, ``agent`` when nothing is left of
    the name; then ``-2``, ``-3``, ... until it is free. Example: ``"Docs assistant"`` →
    ``docs-assistant``, or ``docs-assistant-2`` when that is taken.
    """
    base = slugify(name)[:SLUG_MAX_LENGTH].strip("-_") or "agent"
    slug, n = base, 1
    while slug in taken:
        n += 1
        suffix = f"-{n}"
        slug = base[: SLUG_MAX_LENGTH - len(suffix)].rstrip("-_") + suffix
    return slug


def output_schema_problem(schema: object) -> str:
    """What is wrong with ``schema`` as an agent's output JSON Schema ("" when usable): it must
    be an object that its own ``$schema``'s metaschema accepts (draft 2020-12 when it names none;
    ``jsonschema``'s ``check_schema``)."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, dict):
        return "A JSON Schema is a JSON object, e.g. {\"type\": \"object\", \"properties\": {...}}."
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"Not a valid JSON Schema{f' at /{where}' if where else ''}: {exc.message}"
    return ""


class AgentInstance(TenantOwnedModel):
    """An agent end users chat with: a system prompt, a model route, limits, bound capabilities."""

    name = models.CharField(max_length=100)
    slug = models.CharField(
        max_length=SLUG_MAX_LENGTH, blank=True, validators=[slug_validator],
        help_text=(
            "Names the agent in the OpenAI-compatible API, MCP and A2A; unique in the tenant. "
            "Left blank: made from the name."
        ),
    )
    description = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    route = models.ForeignKey("llm.ModelRoute", on_delete=models.RESTRICT, related_name="agents")
    max_loop_count = models.PositiveIntegerField(
        default=16,
        validators=[MinValueValidator(1), MaxValueValidator(200)],
        help_text="Model turns per run; the last one is offered no tools.",
    )
    tool_max_parallel = models.PositiveIntegerField(
        default=3, validators=[MinValueValidator(1), MaxValueValidator(32)],
        help_text="Tool calls of one turn executed at once.",
    )
    tool_timeout_seconds = models.FloatField(
        default=60.0, validators=[MinValueValidator(0.1), MaxValueValidator(3600)],
        help_text="Longest a single tool call may take.",
    )
    turn_timeout_seconds = models.FloatField(
        default=300.0, validators=[MinValueValidator(1.0), MaxValueValidator(3600)],
        help_text="Longest one model turn may take, retries and fallbacks included.",
    )
    run_timeout_seconds = models.FloatField(
        default=1800.0, validators=[MinValueValidator(1.0), MaxValueValidator(24 * 3600)],
        help_text="Longest a run may work, wall clock from its start; time spent waiting for approvals does not count.",
    )
    message_mode = models.CharField(
        max_length=8, choices=[("queue", "Queue"), ("steer", "Steer")], default="queue",
        help_text=(
            "A message sent while a run is busy: queue = answered by its own run afterwards; "
            "steer = handed to the running loop at its next model turn."
        ),
    )
    max_tokens_per_run = models.PositiveIntegerField(
        null=True, blank=True, help_text="Budget: prompt + completion tokens per run; blank: no limit.",
    )
    max_cost_per_run_usd = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, validators=[MinValueValidator(0)],
        help_text="Budget: USD per run; blank: no limit.",
    )
    output_schema = models.JSONField(
        null=True, blank=True,
        help_text=(
            "Structured output: a JSON Schema the final answer must be valid against (the model is told it; route "
            "entries with native JSON-schema mode enforce it). Blank: free text. An API caller's response_format "
            "replaces it for that run."
        ),
    )
    output_repairs = models.PositiveSmallIntegerField(
        default=2, validators=[MaxValueValidator(5)],
        help_text="Structured output: repair turns an invalid answer gets (with the validation error) before the "
                  "run fails output_invalid.",
    )
    routing_rules = models.JSONField(
        default=list, blank=True,
        help_text=(
            'Ordered rules choosing the model route of a turn, first match wins, else the route above: '
            '[{"name": "vision", "route": "<route name>", "images": true}, ...]. Conditions (all given must hold): '
            '"regex" (on the latest user message), "keywords" (a list; any, case-insensitive), "images" (true: the '
            'conversation has images), "min_tokens" (the prompt\'s estimated tokens), "min_budget_share" '
            "(0-1: share of max_cost_per_run_usd spent). See docs/admin-guide.md."
        ),
    )
    is_active = models.BooleanField(default=True)
    a2a_public = models.BooleanField(
        default=False,
        help_text=(
            "A2A: anyone may read the agent's card (/a2a/<slug>/.well-known/agent-card.json) without a token; "
            "calling the agent still needs one of this tenant's API tokens."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_version = models.ForeignKey(
        "agents.AgentVersion", null=True, blank=True, editable=False, on_delete=models.SET_NULL, related_name="+",
        help_text="What the chat app, the APIs and schedules run (agents.versions); blank: the draft.",
    )
    draft_version = models.ForeignKey(
        "agents.AgentVersion", null=True, blank=True, editable=False, on_delete=models.SET_NULL, related_name="+",
        help_text="The latest version (the configuration as saved now).",
    )

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="agent_unique_name"),
            models.UniqueConstraint(fields=["tenant", "slug"], name="agent_unique_slug"),
        ]
        verbose_name = "agent"

    def __str__(self) -> str:
        return self.name

    def _others(self) -> models.QuerySet:
        """The tenant's other agents (as far as the current tenant scope sees)."""
        return type(self).all_tenants.filter(tenant_id=self.tenant_id).exclude(pk=self.pk)

    def _other_slugs(self) -> set[str]:
        return set(self._others().values_list("slug", flat=True))

    def clean(self) -> None:
        """Route of the same tenant; name and slug free in the tenant (a blank slug is made from
        the name). The uniqueness checks are here, not left to the constraints: forms that do not
        show ``tenant`` (the console, the API) exclude it, and Django then skips every
        constraint that names it."""
        if self.route_id and self.tenant_id and self.route.tenant_id != self.tenant_id:
            raise ValidationError({"route": "Route not found."})
        if not self.tenant_id:
            return
        errors = self._output_and_routing_errors()
        if self.name and self._others().filter(name=self.name).exists():
            errors["name"] = f"Another agent of this tenant is called {self.name!r}."
        if not self.slug:
            self.slug = agent_slug_from_name(self.name, self._other_slugs())
        elif self.slug in self._other_slugs():
            errors["slug"] = f"Another agent of this tenant has the slug {self.slug!r}."
        if errors:
            raise ValidationError(errors)

    def _output_and_routing_errors(self) -> dict[str, Any]:
        """``{field: message}`` for an ``output_schema`` that is no JSON Schema and for
        ``routing_rules`` that are malformed or name a route this tenant does not have."""
        from agents.routing import routing_rules_errors

        errors: dict[str, Any] = {}
        if self.output_schema is not None:
            problem = output_schema_problem(self.output_schema)
            if problem:
                errors["output_schema"] = problem
        rule_errors = routing_rules_errors(self.routing_rules, tenant_id=self.tenant_id)
        if rule_errors:
            errors["routing_rules"] = rule_errors
        return errors

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save; a blank slug is made from the name first (rows made without ``full_clean``)."""
        if not self.slug and self.tenant_id:
            self.slug = agent_slug_from_name(self.name, self._other_slugs())
        super().save(*args, **kwargs)


class AgentVersion(TenantOwnedModel):
    """An immutable snapshot of an agent's configuration (:mod:`agents.versions`): ``config`` is
    :func:`agents.versions.agent_config` (fields, route and bindings by name; no secrets),
    ``content_hash`` the sha256 of its canonical JSON, ``number`` 1, 2, ... per agent."""

    agent = models.ForeignKey(AgentInstance, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64)
    config = models.JSONField()
    note = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["agent", "-number"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"], name="agent_version_unique_number")]

    def __str__(self) -> str:
        return f"{self.agent.name} v{self.number}"


def capability_kind_choices() -> list[tuple[str, str]]:
    """The registered capability kinds (``[(key, label)]``), read when a form or check needs them."""
    from capabilities.registry import kind_choices

    return kind_choices()


class CapabilityKind(models.TextChoices):
    """The keys of the platform's own capability kinds (for code that names one; the
    registry, :mod:`capabilities.registry`, is what decides which kinds exist)."""

    MCP_SERVER = "mcp_server", "MCP server"
    BUILTIN = "builtin", "Built-in tool"
    CLI = "cli", "CLI command"
    BROWSER = "browser", "Browser"
    SKILL = "skill", "Skill"


class ApprovalAction(models.TextChoices):
    """What a binding's approval policy says about a tool call."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class CapabilityBinding(TenantOwnedModel):
    """Links an agent to a capability, optionally restricted to an allow-list of tool names."""

    agent = models.ForeignKey(AgentInstance, on_delete=models.CASCADE, related_name="bindings")
    kind = models.CharField(max_length=20, choices=capability_kind_choices)
    """A registered capability kind's key (:mod:`capabilities.registry`; choices follow the registry)."""
    mcp_server = models.ForeignKey(
        "capabilities.McpServer", null=True, blank=True, on_delete=models.CASCADE, related_name="bindings"
    )
    builtin_name = models.CharField(max_length=64, blank=True, help_text="Built-in tool name, e.g. todo_write.")
    cli_command = models.ForeignKey(
        "capabilities.CliCommand", null=True, blank=True, on_delete=models.CASCADE, related_name="bindings"
    )
    skill = models.ForeignKey(
        "capabilities.Skill", null=True, blank=True, on_delete=models.CASCADE, related_name="bindings",
        help_text="kind skill: the skill offered as a tool.",
    )
    allowed_tools = models.JSONField(
        default=list, blank=True,
        help_text="Tool names (as the capability names them) to expose; empty means all.",
    )
    approval_policy = models.JSONField(
        default=list, blank=True,
        help_text=(
            'Rules checked in order, first match wins: [{"pattern": "delete_*", "action": "ask"}, ...]. '
            "Patterns are shell-style (fnmatch) and match the tool's name as the capability names it or "
            "its exposed name. Actions: allow, ask (a human approves each call), deny. No match: allow."
        ),
    )
    config = models.JSONField(
        default=dict, blank=True, help_text="Settings of this kind of capability (see the README for each kind).",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["agent", "id"]

    def __str__(self) -> str:
        target = (
            self.mcp_server.name if self.mcp_server_id
            else self.cli_command.name if self.cli_command_id
            else self.skill.name if self.skill_id else self.builtin_name or self.kind
        )
        return f"{self.agent.name} → {target}"

    def clean(self) -> None:
        """Check the binding: its kind's own rules (:meth:`capabilities.registry.CapabilityKind.validate`),
        then what every binding needs (its agent in its tenant, ``allowed_tools`` a list of
        names, a valid approval policy, ``config`` an object).

        Raises:
            ValidationError: ``{field: message}``, the first problem found.
        """
        from capabilities.registry import kind_get

        kind = kind_get(self.kind)
        if kind is None:
            raise ValidationError({"kind": f"Unknown capability kind {self.kind!r}."})
        errors = kind.validate(self) or self._common_errors(uses_skill="skill" in kind.fields)
        if errors:
            raise ValidationError(errors)

    def _common_errors(self, *, uses_skill: bool) -> dict[str, Any]:
        """The first problem every binding is checked for (``{}``: none), as ``{field: message(s)}``."""
        if self.skill_id and not uses_skill:
            return {"skill": "Only bindings of kind skill name a skill."}
        if self.agent_id and self.tenant_id and self.agent.tenant_id != self.tenant_id:
            return {"agent": "Agent not found."}
        if not isinstance(self.allowed_tools, list) or not all(isinstance(t, str) for t in self.allowed_tools):
            return {"allowed_tools": "A JSON list of tool names."}
        policy_errors = approval_policy_errors(self.approval_policy) or approval_members_unknown(
            tenant_id=self.tenant_id, policy=self.approval_policy)
        if policy_errors:
            return {"approval_policy": policy_errors}
        if not isinstance(self.config, dict):
            return {"config": "A JSON object."}
        return {}


APPROVAL_TIMEOUT_MAX_SECONDS = 90 * 24 * 3600
"""The longest ``timeout_seconds`` of an approval rule: 90 days (a pause holds no worker)."""

APPROVAL_MESSAGE_MAX_CHARS = 2000
"""The longest ``message`` of an approval rule (shown to the approvers)."""

APPROVAL_MEMBERS_MAX = 50
"""The most ``approvers.members`` one rule may name."""

APPROVAL_RULE_FIELDS = ("pattern", "action", "approvers", "message", "timeout_seconds", "on_timeout")
"""The fields of an approval rule; all but ``pattern`` and ``action`` only for action ``ask``."""

APPROVAL_ON_TIMEOUT = ("deny", "approve")
"""An ``ask`` rule's ``on_timeout``: the decision made when nobody decided in time (absent: the
run fails ``approval_expired``, as before approvers existed)."""

APPROVER_FIELDS = ("requester", "roles", "members")
"""The fields of an ``ask`` rule's ``approvers``."""


def approval_policy_errors(policy: object) -> list[str]:
    """What is wrong with an approval policy (``[]`` when it is valid), one message per bad
    rule, naming the rule and the field.

    Valid: a list of rules ``{"pattern": str, "action": "allow" | "ask" | "deny"}``; an ``ask``
    rule may add

    - ``approvers``: ``{"requester": bool, "roles": ["owner" | "admin" | "member", ...],
      "members": [user id | e-mail address, ...]}`` (who may decide; absent: the run's user);
    - ``message``: a text shown to the approvers (≤ :data:`APPROVAL_MESSAGE_MAX_CHARS`);
    - ``timeout_seconds``: how long the call waits, an integer from 1 to
      :data:`APPROVAL_TIMEOUT_MAX_SECONDS` (absent: the ``APPROVAL_TTL_SECONDS`` setting);
    - ``on_timeout``: ``deny`` or ``approve``, decided when nobody decided in time (absent:
      the run fails ``approval_expired``).
    """
    if not isinstance(policy, list):
        return ['A JSON list of {"pattern": ..., "action": "allow" | "ask" | "deny"} rules.']
    errors = []
    for i, rule in enumerate(policy):
        error = _rule_error(rule)
        if error:
            errors.append(f"Rule {i + 1}: {error}")
    return errors


def _rule_error(rule: object) -> str:
    """The first problem of one rule ('' if none)."""
    if not isinstance(rule, dict) or not isinstance(rule.get("pattern"), str) or not rule["pattern"]:
        return "needs a non-empty string 'pattern'."
    if rule.get("action") not in ApprovalAction.values:
        return f"'action' must be one of {', '.join(ApprovalAction.values)}."
    unknown = sorted(set(rule) - set(APPROVAL_RULE_FIELDS))
    if unknown:
        return f"{unknown[0]!r} is not a field of a rule ({', '.join(APPROVAL_RULE_FIELDS)})."
    ask_only = [key for key in APPROVAL_RULE_FIELDS[2:] if key in rule]
    if ask_only and rule["action"] != ApprovalAction.ASK:
        return f"{ask_only[0]!r} applies only to rules with action 'ask'."
    return _ask_fields_error(rule)


def _ask_fields_error(rule: dict[str, Any]) -> str:
    """The first problem of an ``ask`` rule's own fields ('' if none)."""
    message = rule.get("message", "")
    if not isinstance(message, str) or len(message) > APPROVAL_MESSAGE_MAX_CHARS:
        return f"'message' must be a text of at most {APPROVAL_MESSAGE_MAX_CHARS} characters."
    timeout = rule.get("timeout_seconds", 1)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= APPROVAL_TIMEOUT_MAX_SECONDS:
        return f"'timeout_seconds' must be a whole number of seconds from 1 to {APPROVAL_TIMEOUT_MAX_SECONDS}."
    if "on_timeout" in rule and rule["on_timeout"] not in APPROVAL_ON_TIMEOUT:
        return f"'on_timeout' must be one of {', '.join(APPROVAL_ON_TIMEOUT)}."
    if "approvers" in rule:
        return _approvers_error(rule["approvers"])
    return ""


def _approvers_error(approvers: object) -> str:
    """The first problem of a rule's ``approvers`` ('' if none)."""
    if not isinstance(approvers, dict):
        return "'approvers' must be an object {\"requester\": bool, \"roles\": [...], \"members\": [...]}."
    unknown = sorted(set(approvers) - set(APPROVER_FIELDS))
    if unknown:
        return f"'approvers.{unknown[0]}' is not a field of approvers ({', '.join(APPROVER_FIELDS)})."
    if not isinstance(approvers.get("requester", False), bool):
        return "'approvers.requester' must be true or false."
    roles = approvers.get("roles", [])
    if not isinstance(roles, list) or any(role not in Role.values for role in roles):
        return f"'approvers.roles' must be a list of the roles {', '.join(Role.values)}."
    members = approvers.get("members", [])
    if not isinstance(members, list) or len(members) > APPROVAL_MEMBERS_MAX or not all(
        _member_reference_ok(m) for m in members
    ):
        return (f"'approvers.members' must be a list of at most {APPROVAL_MEMBERS_MAX} user ids or "
                "e-mail addresses.")
    if not (approvers.get("requester") or roles or members):
        return "'approvers' names nobody: set requester, roles or members."
    return ""


def _member_reference_ok(member: object) -> bool:
    """A user id (a positive integer) or an e-mail address (a string with one ``@``)."""
    if isinstance(member, bool):
        return False
    if isinstance(member, int):
        return member > 0
    return isinstance(member, str) and len(member) <= 254 and member.count("@") == 1 and member.strip() == member


def approval_members_unknown(*, tenant_id: int | None, policy: list[dict[str, Any]]) -> list[str]:
    """The ``approvers.members`` of a valid policy that are not members of tenant ``tenant_id``,
    one message per rule (``[]``: all are; nothing is checked without a tenant)."""
    named = [(i, (rule.get("approvers") or {}).get("members") or []) for i, rule in enumerate(policy)]
    if tenant_id is None or not any(members for _, members in named):
        return []
    known = _member_keys(tenant_id)
    errors = []
    for i, members in named:
        unknown = [str(m) for m in members if (m.lower() if isinstance(m, str) else m) not in known]
        if unknown:
            errors.append(f"Rule {i + 1}: 'approvers.members' names no member of this tenant: {', '.join(unknown)}.")
    return errors


def _member_keys(tenant_id: int) -> set[int | str]:
    """The user ids and lower-cased e-mail addresses of tenant ``tenant_id``'s members."""
    # tenant-bypass: the binding's own tenant, named explicitly
    rows = Membership.all_tenants.filter(tenant_id=tenant_id).values_list("user_id", "user__email")
    return {key for user_id, email in rows for key in (user_id, (email or "").lower()) if key}
