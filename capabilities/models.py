"""Capability definitions owned by a tenant (MCP servers, CLI commands; skills, browser later)."""

from __future__ import annotations

from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


class McpTransport(models.TextChoices):
    STDIO = "stdio", "stdio (a local process)"
    STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"
    SSE = "sse", "HTTP+SSE (legacy, 2024-11-05)"


RESERVED_MCP_ALIASES = frozenset({"builtin", "cli", "skill", "browser"})
"""Tool sources of the platform itself (sessions/runner/toolset.py): an MCP server may not use
one as its alias, or its tools would be named like the platform's."""


class McpServer(TenantOwnedModel):
    """An MCP server the tenant's agents can be bound to.

    ``env`` (stdio) and ``headers`` (HTTP) may hold secrets: both are stored encrypted with
    the tenant's data key and never returned by the API.
    """

    name = models.CharField(max_length=100)
    alias = models.CharField(
        max_length=32,
        validators=[RegexValidator(r"^[a-z0-9][a-z0-9_-]*$", "Lowercase letters, digits, '-' and '_'.")],
        help_text="Short name used to prefix tool names when they collide.",
    )
    transport = models.CharField(max_length=20, choices=McpTransport.choices, default=McpTransport.STDIO)
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the executable.")
    args = models.JSONField(default=list, blank=True, help_text="stdio: a JSON list of arguments.")
    env_encrypted = models.TextField(blank=True, editable=False)
    url = models.URLField(
        max_length=500, blank=True, help_text="Streamable HTTP: the endpoint URL; HTTP+SSE: the SSE stream URL."
    )
    headers_encrypted = models.TextField(blank=True, editable=False)
    connect_timeout_seconds = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.1)],
        help_text="Seconds for spawning/dialling the server plus the MCP handshake.",
    )
    list_timeout_seconds = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.1)],
        help_text="Seconds for listing all tools (every page of tools/list).",
    )
    call_timeout_seconds = models.FloatField(
        default=60.0, validators=[MinValueValidator(0.1)],
        help_text="Seconds for one tool call (the agent's tool timeout applies too; the shorter wins).",
    )
    tools_snapshot = models.JSONField(
        default=list, blank=True, editable=False,
        help_text="The tools the server last listed: [{name, description, input_schema}].",
    )
    tools_snapshot_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False, help_text="The last connection or listing error.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="mcpserver_unique_name"),
            models.UniqueConstraint(fields=["tenant", "alias"], name="mcpserver_unique_alias"),
        ]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.transport == McpTransport.STDIO and not self.command:
            raise ValidationError({"command": "A stdio server needs a command."})
        if self.transport in (McpTransport.STREAMABLE_HTTP, McpTransport.SSE) and not self.url:
            raise ValidationError({"url": "An HTTP server needs a URL."})
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise ValidationError({"args": "A JSON list of strings."})
        if self.alias in RESERVED_MCP_ALIASES:
            raise ValidationError({"alias": f"{self.alias!r} names the platform's own tools; choose another alias."})


from capabilities.cli.models import CliCommand  # noqa: E402,F401  (registers the model in this app)
from capabilities.skills.models import Skill  # noqa: E402,F401
