"""Capability definitions owned by a tenant (MCP servers, CLI commands; skills, browser later)."""

from __future__ import annotations

from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


class McpTransport(models.TextChoices):
    STDIO = "stdio", "stdio (a local process)"
    STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"
    SSE = "sse", "HTTP+SSE (legacy, 2024-11-05)"


class McpAuthMode(models.TextChoices):
    NONE = "none", "None (or static headers)"
    OAUTH_USER = "oauth_user", "OAuth: each user connects their own account"
    OAUTH_TENANT = "oauth_tenant", "OAuth: an admin connects one account for the tenant"
    OAUTH_CLIENT_CREDENTIALS = "oauth_client_credentials", "OAuth client credentials: the tenant's own client, no person"


RESERVED_MCP_ALIASES = frozenset({"builtin", "cli", "skill", "browser"})
"""Tool sources of the platform itself (sessions/runner/toolset.py): an MCP server may not use
one as its alias, or its tools would be named like the platform's."""


class McpServer(TenantOwnedModel):
    """An MCP server the tenant's agents can be bound to.

    A stdio server is an operator's template (:class:`~capabilities.catalogue.ProgramTemplate`
    of kind ``mcp_stdio``) enabled for the tenant: the tenant fills its ``parameters`` and
    secrets (``env``: only the names the template declares), never a command line. An HTTP
    server (streamable HTTP, SSE) is a URL, address-checked like web_fetch.

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
    template = models.ForeignKey(
        "capabilities.ProgramTemplate", on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        limit_choices_to={"kind": "mcp_stdio", "enabled": True},
        help_text="stdio: the program, from the operator's catalogue.",
    )
    parameters = models.JSONField(
        default=dict, blank=True, help_text="stdio: values of the template's tenant parameters.",
    )
    env_encrypted = models.TextField(blank=True, editable=False)
    url = models.URLField(
        max_length=500, blank=True, help_text="Streamable HTTP: the endpoint URL; HTTP+SSE: the SSE stream URL."
    )
    headers_encrypted = models.TextField(blank=True, editable=False)
    auth_mode = models.CharField(
        max_length=30, choices=McpAuthMode.choices, default=McpAuthMode.NONE,
        help_text="HTTP servers: OAuth 2.1 per user or per tenant, or the tenant's client credentials "
                  "(capabilities/mcp_oauth).",
    )
    oauth_client_id = models.CharField(
        max_length=500, blank=True,
        help_text="OAuth: a client an admin registered with the authorization server; empty: the platform's "
                  "Client ID Metadata Document, else dynamic registration.",
    )
    oauth_client_secret_encrypted = models.TextField(blank=True, editable=False)
    oauth_private_key_encrypted = models.TextField(
        blank=True, editable=False,
        help_text="OAuth client credentials: the PEM private key of private_key_jwt (RFC 7523), encrypted.",
    )
    oauth_scope = models.CharField(
        max_length=1000, blank=True,
        help_text="OAuth: the scopes to ask for (space-separated); empty: what the server's metadata says.",
    )
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

        from capabilities.catalogue import TemplateKind, parameters_errors

        if self.transport == McpTransport.STDIO:
            template = self.template
            if template is None:
                raise ValidationError({"template": "A stdio server is a program from the operator's catalogue: choose one."})
            if template.kind != TemplateKind.MCP_STDIO:
                raise ValidationError({"template": "This template is not a stdio MCP server."})
            if self.tenant_id and not template.available_to(self.tenant_id):
                raise ValidationError({"template": "This template is not available to the tenant."})
            problems = parameters_errors(template, self.parameters)
            if problems:
                raise ValidationError({"parameters": problems})
        elif self.template_id is not None:
            raise ValidationError({"template": "Only a stdio server has a template."})
        self._clean_http()
        if self.alias in RESERVED_MCP_ALIASES:
            raise ValidationError({"alias": f"{self.alias!r} names the platform's own tools; choose another alias."})


    def _clean_http(self) -> None:
        """An HTTP server's URL (present, and allowed by the outbound address rules); OAuth only
        on HTTP servers."""
        from django.core.exceptions import ValidationError

        if self.transport == McpTransport.STDIO:
            if self.auth_mode != McpAuthMode.NONE:
                raise ValidationError({"auth_mode": "OAuth is for HTTP servers (Streamable HTTP, SSE)."})
            return
        if not self.url:
            raise ValidationError({"url": "An HTTP server needs a URL."})
        # The outbound address rules (no loopback, private, metadata … unless an operator
        # allowed the host); every connect is checked again (capabilities/netsafe.py).
        from capabilities.netsafe import FetchError, check_outbound_url

        try:
            check_outbound_url(self.url)
        except FetchError as exc:
            raise ValidationError({"url": exc.message}) from exc


from capabilities.a2a.models import A2aAgent  # noqa: E402,F401  (registers the model in this app)
from capabilities.catalogue import ProgramTemplate  # noqa: E402,F401
from capabilities.cli.models import CliCommand  # noqa: E402,F401
from capabilities.commands.models import Command  # noqa: E402,F401
from capabilities.mcp_oauth.models import McpOAuthConnection  # noqa: E402,F401
from capabilities.skills.models import Skill  # noqa: E402,F401
