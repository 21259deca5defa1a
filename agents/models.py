"""Agent instances and the capabilities bound to them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


class AgentInstance(TenantOwnedModel):
    """An agent end users chat with: a system prompt, a model route, limits, bound capabilities."""

    name = models.CharField(max_length=100)
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
    max_tokens_per_run = models.PositiveIntegerField(
        null=True, blank=True, help_text="Budget: prompt + completion tokens per run; blank: no limit.",
    )
    max_cost_per_run_usd = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, validators=[MinValueValidator(0)],
        help_text="Budget: USD per run; blank: no limit.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="agent_unique_name")]
        verbose_name = "agent"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.route_id and self.tenant_id and self.route.tenant_id != self.tenant_id:
            raise ValidationError({"route": "Route not found."})


class CapabilityKind(models.TextChoices):
    MCP_SERVER = "mcp_server", "MCP server"
    BUILTIN = "builtin", "Built-in tool"


class CapabilityBinding(TenantOwnedModel):
    """Links an agent to a capability, optionally restricted to an allow-list of tool names."""

    agent = models.ForeignKey(AgentInstance, on_delete=models.CASCADE, related_name="bindings")
    kind = models.CharField(max_length=20, choices=CapabilityKind.choices)
    mcp_server = models.ForeignKey(
        "capabilities.McpServer", null=True, blank=True, on_delete=models.CASCADE, related_name="bindings"
    )
    builtin_name = models.CharField(max_length=64, blank=True, help_text="Built-in tool name, e.g. todo_write.")
    allowed_tools = models.JSONField(
        default=list, blank=True,
        help_text="Tool names (as the capability names them) to expose; empty means all.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["agent", "id"]

    def __str__(self) -> str:
        target = self.mcp_server.name if self.mcp_server_id else self.builtin_name
        return f"{self.agent.name} → {target}"

    def clean(self) -> None:
        from capabilities.builtin.registry import builtin_names

        if self.kind == CapabilityKind.MCP_SERVER:
            if not self.mcp_server_id:
                raise ValidationError({"mcp_server": "Choose an MCP server."})
            if self.tenant_id and self.mcp_server.tenant_id != self.tenant_id:
                raise ValidationError({"mcp_server": "MCP server not found."})
        elif self.kind == CapabilityKind.BUILTIN:
            if self.builtin_name not in builtin_names():
                raise ValidationError({"builtin_name": f"Unknown built-in tool; choose one of {sorted(builtin_names())}."})
        if self.agent_id and self.tenant_id and self.agent.tenant_id != self.tenant_id:
            raise ValidationError({"agent": "Agent not found."})
        if not isinstance(self.allowed_tools, list) or not all(isinstance(t, str) for t in self.allowed_tools):
            raise ValidationError({"allowed_tools": "A JSON list of tool names."})
