"""Writes for capability definitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from capabilities.catalogue import ProgramTemplate, TemplateKind, secrets_errors, template_argv, template_profile
from capabilities.cli.models import CliCommand
from capabilities.cli.tool import CliCommandConfig
from capabilities.data_dirs import template_data_bind
from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.operations import McpToolInfo
from capabilities.mcp.tool import cap_description
from capabilities.models import McpServer, McpTransport
from capabilities.tools import ToolError
from tenants.crypto import secret_decrypt_json, secret_encrypt, secret_encrypt_json
from tenants.models import Tenant
from tenants.scoping import system_scope, tenant_scope


@transaction.atomic
def mcp_server_save(
    *,
    tenant: Tenant,
    server: McpServer | None = None,
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    oauth_client_secret: str | None = None,
    oauth_private_key: str | None = None,
    **fields: Any,
) -> McpServer:
    """Create or update an MCP server. ``env``/``headers``/``oauth_client_secret``/
    ``oauth_private_key`` (a PEM private key, for client credentials with ``private_key_jwt``)
    None keep the stored secrets.

    ``env`` (stdio) may only name the template's secrets.

    Raises:
        ValidationError: by field, e.g. a stdio server without a template, or a secret the
            template does not declare.
    """
    server = server or McpServer(tenant=tenant)
    for name, value in fields.items():
        setattr(server, name, value)
    if env:
        template = server.template if server.transport == McpTransport.STDIO else None
        problems = secrets_errors(template, env) if template is not None else (
            ["Only a stdio server from a template has secrets (use headers for an HTTP server)."]
            if server.transport != McpTransport.STDIO else [])
        if problems:
            raise ValidationError({"env": problems})
    if env is not None:
        server.env_encrypted = secret_encrypt_json(tenant=tenant, value=env)
    if headers is not None:
        server.headers_encrypted = secret_encrypt_json(tenant=tenant, value=headers)
    if oauth_client_secret is not None:
        server.oauth_client_secret_encrypted = secret_encrypt(tenant=tenant, plaintext=oauth_client_secret)
    if oauth_private_key is not None:
        server.oauth_private_key_encrypted = secret_encrypt(tenant=tenant, plaintext=oauth_private_key)
    server.full_clean()
    server.save()
    return server


def mcp_tools_snapshot(tools: Sequence[McpToolInfo]) -> list[dict[str, Any]]:
    """The JSON stored in ``McpServer.tools_snapshot``: ``[{name, description, input_schema}]``.

    Descriptions are capped like the ones the model sees (1,024 characters).
    """
    return [
        {"name": t.name, "description": cap_description(t.description), "input_schema": t.input_schema}
        for t in tools
    ]


def mcp_server_tools_snapshot_save(
    *, tenant_id: int, server_id: int, tools: Sequence[McpToolInfo] | None, error: str = ""
) -> None:
    """Store what a server listed (or why it could not be listed), for the console.

    Args:
        tenant_id: The server's tenant (the write is scoped to it).
        server_id: ``McpServer`` primary key.
        tools: The full catalogue, or None to keep the previous snapshot (connection failed).
        error: The failure message ('' on success: clears ``last_error``).

    Updates ``tools_snapshot``/``tools_snapshot_at`` (when ``tools`` is given) and
    ``last_error``; a missing server (deleted meanwhile) is ignored.
    """
    fields: dict[str, Any] = {"last_error": error[:4000]}
    if tools is not None:
        fields["tools_snapshot"] = mcp_tools_snapshot(tools)
        fields["tools_snapshot_at"] = timezone.now()
    with tenant_scope(tenant_id):
        McpServer.objects.filter(pk=server_id).update(**fields)


@dataclass(frozen=True, slots=True)
class McpConnectionTest:
    """What "Test connection" found."""

    ok: bool
    tools: tuple[McpToolInfo, ...] = ()
    """Every tool the server listed (all pages), when ``ok``."""
    error: str = ""
    """Why it failed (connect, handshake or listing; with the server's stderr tail for stdio)."""
    seconds: float = 0.0
    """Wall time of connect + list, in seconds."""


def mcp_server_config(*, server: McpServer) -> McpServerConfig:
    """The client configuration of ``server``, secrets decrypted (never log it: env/headers).

    A stdio server is its operator template rendered with the tenant's parameters, confined by
    the template's sandbox profile with the tenant's secrets as its environment: a stdio
    configuration made here always has a ``sandbox``.

    Raises:
        ValueError: the configuration is unusable (a stdio server without a template, a template
            no longer offered to the tenant, parameters that no longer fit it).
    """
    tenant = Tenant.objects.get(pk=server.tenant_id)
    env = secret_decrypt_json(tenant=tenant, ciphertext=server.env_encrypted)
    if server.transport == McpTransport.STDIO:
        template = ProgramTemplate.objects.filter(pk=server.template_id).first()
        if template is None or template.kind != TemplateKind.MCP_STDIO:
            raise ValueError(f"the stdio MCP server {server.alias!r} has no program template")
        if not template.available_to(server.tenant_id):
            raise ValueError(f"the program template {template.slug!r} is not available to this tenant")
        argv = template_argv(template, server.parameters or {})
        data_bind = template_data_bind(template, tenant_id=server.tenant_id, owner=f"server-{server.pk}",
                                       uid=settings.SANDBOX_UID, gid=settings.SANDBOX_GID)
        return McpServerConfig(
            alias=server.alias, transport="stdio", command=argv[0], args=tuple(argv[1:]),
            sandbox=template_profile(template, env, data_bind=data_bind),
            connect_timeout_seconds=server.connect_timeout_seconds,
            list_timeout_seconds=server.list_timeout_seconds,
            call_timeout_seconds=min(server.call_timeout_seconds, template.timeout_seconds),
        )
    return McpServerConfig(
        alias=server.alias,
        transport=server.transport,
        url=server.url,
        headers=secret_decrypt_json(tenant=tenant, ciphertext=server.headers_encrypted),
        connect_timeout_seconds=server.connect_timeout_seconds,
        list_timeout_seconds=server.list_timeout_seconds,
        call_timeout_seconds=server.call_timeout_seconds,
    )


def cli_command_config(*, command: CliCommand) -> CliCommandConfig:
    """The runner's configuration of a tenant's CLI command: its template's argv (rendered with
    the tenant's parameters), argument schema and sandbox profile, the tenant's secrets
    decrypted into the profile's environment (never log it), the tighter of both limits.

    Raises:
        ValueError: no template, or one no longer offered to the tenant, or parameters that no
            longer fit it (the run then fails with reason ``configuration``).
    """
    template = ProgramTemplate.objects.filter(pk=command.template_id).first()
    if template is None or template.kind != TemplateKind.CLI:
        raise ValueError(f"the CLI command {command.name!r} has no program template")
    if not template.available_to(command.tenant_id):
        raise ValueError(f"the program template {template.slug!r} is not available to this tenant")
    tenant = Tenant.objects.get(pk=command.tenant_id)
    secrets = secret_decrypt_json(tenant=tenant, ciphertext=command.env_encrypted)
    return CliCommandConfig(
        name=command.name,
        description=command.description or template.description,
        argv_template=tuple(template_argv(template, command.parameters or {})),
        parameters_schema=dict(template.parameters_schema or {}),
        timeout_seconds=min(command.timeout_seconds, template.timeout_seconds),
        max_output_bytes=min(command.max_output_bytes, template.max_output_bytes),
        profile=template_profile(template, secrets),
    )


def mcp_server_test_connection(*, server: McpServer) -> McpConnectionTest:
    """Connect to ``server`` with its own timeouts, list every tool, store the snapshot.

    A fresh connection (not the pool), closed before returning; a stdio server is spawned,
    confined, and terminated. Runs in a worker
    (:func:`capabilities.mcp_test_request.mcp_server_test_connection_request` is what the
    console calls: the web process never starts a tenant's program). Blocks for at most about
    ``connect_timeout_seconds + list_timeout_seconds`` (+ the bounded close); runs its own
    event loop, so call it from a thread without one.

    Side effects: ``tools_snapshot``/``tools_snapshot_at`` on success, ``last_error`` always.
    """
    started = time.monotonic()
    try:
        config = mcp_server_config(server=server)
    except ValueError as exc:
        result = McpConnectionTest(ok=False, error=f"Invalid configuration: {exc}")
    else:

        async def probe() -> list[McpToolInfo]:
            async with McpConnection(config) as connection:
                return await connection.list_tools()

        try:
            tools = asyncio.run(probe())
        except ToolError as exc:
            result = McpConnectionTest(ok=False, error=exc.message, seconds=time.monotonic() - started)
        else:
            result = McpConnectionTest(ok=True, tools=tuple(tools), seconds=time.monotonic() - started)
    mcp_server_tools_snapshot_save(
        tenant_id=server.tenant_id, server_id=server.pk, tools=result.tools if result.ok else None, error=result.error
    )
    return result


def mcp_server_test_connection_reply(*, tenant_id: int, server_id: int, reply_key: str) -> None:
    """The worker's side of :func:`capabilities.mcp_test_request.mcp_server_test_connection_request`:
    test, push the result (the task ``capabilities.mcp_server_test_connection`` calls it).

    A server that is gone (or not the tenant's) answers as a failed test.
    """
    import json

    import redis
    from django.conf import settings

    with tenant_scope(tenant_id):
        server = McpServer.objects.filter(pk=server_id).first()
        result = (mcp_server_test_connection(server=server) if server is not None
                  else McpConnectionTest(ok=False, error="MCP server not found."))
    payload = {
        "ok": result.ok, "error": result.error, "seconds": result.seconds,
        "tools": [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in result.tools],
    }
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        with client.pipeline() as pipe:
            pipe.rpush(reply_key, json.dumps(payload))
            pipe.expire(reply_key, 300)
            pipe.execute()
    finally:
        client.close()


@transaction.atomic
def cli_command_save(
    *, tenant: Tenant, command: CliCommand | None = None, env: dict[str, str] | None = None, **fields: Any
) -> CliCommand:
    """Create or update a tenant's CLI command (a catalogue template under a tool name).

    ``env`` None keeps the stored secrets; it may only name the template's secrets.

    Raises:
        ValidationError: by field (no template, a template of another kind or not offered to
            the tenant, parameters or secrets that do not fit it, limits above it).
    """
    command = command or CliCommand(tenant=tenant)
    for name, value in fields.items():
        setattr(command, name, value)
    if env:
        if command.template is None:
            raise ValidationError({"template": "Choose a program from the operator's catalogue."})
        problems = secrets_errors(command.template, env)
        if problems:
            raise ValidationError({"env": problems})
    if env is not None:
        command.env_encrypted = secret_encrypt_json(tenant=tenant, value=env)
    command.full_clean()
    command.save()
    return command


CATALOGUE_FIELDS = (
    "name", "description", "kind", "argv", "tenant_parameters", "secrets", "env", "network", "ro_binds",
    "parameters_schema", "timeout_seconds", "max_output_bytes", "limits", "data_dir", "enabled",
)
"""The fields a catalogue file may set for a template (besides ``slug`` and ``tenants``)."""


@transaction.atomic
def catalogue_import(*, data: Any) -> list[ProgramTemplate]:
    """Create or update the operator's program templates from a parsed catalogue file.

    Args:
        data: ``{"templates": [{"slug": ..., <CATALOGUE_FIELDS>..., "tenants": [slugs]}]}`` (YAML
            or JSON parsed). Templates not in the file are left as they are.

    Returns:
        The templates written, in the file's order.

    Raises:
        ValidationError: the file's shape, an unknown field or tenant, or a template that breaks
            the catalogue's rules (:meth:`ProgramTemplate.clean`); nothing is written then.

    An operator's action: call it outside any tenant scope (a management command).
    """
    if not isinstance(data, dict) or not isinstance(data.get("templates"), list):
        raise ValidationError("A catalogue is a mapping with a list 'templates'.")
    written: list[ProgramTemplate] = []
    for index, item in enumerate(data["templates"]):
        if not isinstance(item, dict) or not isinstance(item.get("slug"), str):
            raise ValidationError(f"templates[{index}]: a mapping with a 'slug'.")
        unknown = set(item) - set(CATALOGUE_FIELDS) - {"slug", "tenants"}
        if unknown:
            raise ValidationError(f"templates[{index}] ({item['slug']}): unknown fields {sorted(unknown)}.")
        template = ProgramTemplate.objects.filter(slug=item["slug"]).first() or ProgramTemplate(slug=item["slug"])
        for name in CATALOGUE_FIELDS:
            if name in item:
                setattr(template, name, item[name])
        try:
            template.full_clean()
        except ValidationError as exc:
            raise ValidationError(f"templates[{index}] ({item['slug']}): {exc.messages}") from exc
        template.save()
        slugs = item.get("tenants") or []
        with system_scope():  # tenant-bypass: an operator names tenants by slug
            tenants = list(Tenant.objects.filter(slug__in=slugs))
        missing = set(slugs) - {t.slug for t in tenants}
        if missing:
            raise ValidationError(f"templates[{index}] ({item['slug']}): no tenants {sorted(missing)}.")
        with system_scope():  # set() reads the tenants offered now (through the tenants table) to drop the others
            template.tenants.set(tenants)
        written.append(template)
    return written
