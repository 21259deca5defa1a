"""The worker's side of the chat app's MCP prompts: list an agent's servers' prompts, get one
with its arguments, complete an argument, each through the worker's MCP pool
(:func:`capabilities.mcp_worker.mcp_loop_run`), and push the answer to the Redis list the web
process waits on (:mod:`capabilities.commands.requests` sends the task
``capabilities.mcp_prompts_request``, which calls :func:`mcp_prompts_reply`).

The web process never connects to a tenant's MCP server (a stdio server is a program it must
not start). A server the person reaches with their own OAuth connection (``oauth_user``), or
the tenant's (``oauth_tenant``), is reached with it here too; without one it answers an error
saying where to connect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any

from capabilities.commands.rendering import CommandArgumentsError, arguments_check
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.pool import mcp_pool
from capabilities.mcp.prompts import McpPromptInfo
from capabilities.mcp_worker import mcp_loop_run
from capabilities.tools import ToolError
from tenants.scoping import tenant_scope

logger = logging.getLogger(__name__)

REPLY_TTL_SECONDS = 300
"""How long an answer nobody read stays in Redis."""


@dataclass(frozen=True, slots=True)
class ServerTarget:
    """One bound MCP server, as the worker reaches it (``config`` None: ``error`` says why not)."""

    server_id: int
    alias: str
    config: McpServerConfig | None
    error: str = ""


def server_targets(*, tenant_id: int, user_id: int | None, server_ids: list[int]) -> list[ServerTarget]:
    """The enabled servers among ``server_ids`` of tenant ``tenant_id`` (others are skipped),
    each with its connection configuration (an OAuth server's with ``user_id``'s connection,
    or the tenant's). Requires the tenant's scope."""
    from capabilities.mcp_oauth.runs import connection_id_for_run
    from capabilities.mcp_oauth.services import connection_auth
    from capabilities.models import McpServer
    from capabilities.services import mcp_server_config

    targets = []
    for server in McpServer.objects.filter(pk__in=server_ids, enabled=True).order_by("alias"):
        try:
            config = mcp_server_config(server=server)
        except ValueError as exc:
            targets.append(ServerTarget(server.pk, server.alias, None, f"Invalid configuration: {exc}"))
            continue
        if server.auth_mode != "none":
            connection_id, why = connection_id_for_run(tenant_id=tenant_id, server_id=server.pk, user_id=user_id)
            if connection_id is None:
                targets.append(ServerTarget(server.pk, server.alias, None, why))
                continue
            config = dataclasses.replace(
                config, auth=connection_auth(tenant_id=tenant_id, server_id=server.pk, connection_id=connection_id),
                auth_key=f"oauth:{connection_id}")
        targets.append(ServerTarget(server.pk, server.alias, config))
    return targets


def _session(tenant_id: int, target: ServerTarget) -> Any:
    assert target.config is not None
    return mcp_pool().session(tenant_id=tenant_id, server_id=target.server_id, config=target.config)


async def prompts_list(tenant_id: int, targets: list[ServerTarget], deadline_seconds: float | None = None
                       ) -> dict[str, Any]:
    """``{servers: [{server_id, alias, prompts: [McpPromptInfo.as_json()], error}]}``, the
    servers listed concurrently (a failing server: its ``error``, no prompts). A server that has
    not answered within ``deadline_seconds`` (None: no bound but the server's own timeouts) is
    an error too; its connect and listing go on in the pool, so the next request finds them."""

    async def one(target: ServerTarget) -> dict[str, Any]:
        row: dict[str, Any] = {"server_id": target.server_id, "alias": target.alias, "prompts": [], "error": target.error}
        if target.config is None:
            return row
        try:
            prompts = await asyncio.wait_for(_session(tenant_id, target).prompts.list(), deadline_seconds)
        except TimeoutError:
            row["error"] = (f"MCP server {target.alias!r} did not list its prompts within {deadline_seconds:g} s "
                            "(still starting?); try again in a moment.")
        except ToolError as exc:
            row["error"] = exc.message
        else:
            row["prompts"] = [p.as_json() for p in prompts]
        return row

    return {"servers": list(await asyncio.gather(*(one(t) for t in targets)))}


async def _prompt_of(session: Any, name: str) -> McpPromptInfo | None:
    return next((p for p in await session.prompts.list() if p.name == name), None)


async def prompt_get(tenant_id: int, target: ServerTarget, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``prompts/get``: ``{description, messages: [PromptMessage as JSON]}``, or ``{error,
    code}`` with code ``not_found`` (no such prompt), ``invalid_arguments`` (a required argument
    missing, an unknown one: the message names it) or the ToolError's code."""
    if target.config is None:
        return {"error": target.error, "code": "mcp_unavailable"}
    session = _session(tenant_id, target)
    try:
        prompt = await _prompt_of(session, name)
        if prompt is None:
            return {"error": f"MCP server {target.alias!r} has no prompt {name!r}.", "code": "not_found"}
        values = arguments_check([a.as_json() for a in prompt.arguments], arguments, free_text=False)
        result = await session.prompts.get(name, values)
    except CommandArgumentsError as exc:
        return {"error": exc.message, "code": "invalid_arguments", "missing": exc.missing, "unknown": exc.unknown}
    except ToolError as exc:
        return {"error": exc.message, "code": exc.code}
    return {"description": result.description or "",
            "messages": [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in result.messages]}


async def prompt_complete(tenant_id: int, target: ServerTarget, name: str, argument: str, value: str,
                          context: dict[str, str]) -> dict[str, Any]:
    """``completion/complete``: ``{values, has_more}`` (empty when the server offers no
    completions), or ``{error, code}`` (``not_found``: no such prompt; ``invalid_arguments``:
    the prompt has no such argument)."""
    if target.config is None:
        return {"error": target.error, "code": "mcp_unavailable"}
    session = _session(tenant_id, target)
    try:
        prompt = await _prompt_of(session, name)
        if prompt is None:
            return {"error": f"MCP server {target.alias!r} has no prompt {name!r}.", "code": "not_found"}
        if argument not in {a.name for a in prompt.arguments}:
            return {"error": f"Prompt {name!r} has no argument {argument!r}.", "code": "invalid_arguments",
                    "unknown": [argument]}
        completions = await session.prompts.complete(name, argument, value, context)
    except ToolError as exc:
        return {"error": exc.message, "code": exc.code}
    return {"values": list(completions.values), "has_more": completions.has_more}


def mcp_prompts_answer(*, tenant_id: int, user_id: int | None, request: dict[str, Any]) -> dict[str, Any]:
    """Answer one request of :func:`capabilities.commands.requests.mcp_prompts_request` on this
    worker (the shapes are there). Enters the tenant's scope itself."""
    op = request.get("op")
    with tenant_scope(tenant_id):
        ids = request.get("servers") if op == "list" else [request.get("server")]
        targets = server_targets(tenant_id=tenant_id, user_id=user_id,
                                 server_ids=[i for i in ids or () if type(i) is int])
    if op == "list":
        deadline = request.get("deadline_seconds")
        deadline = float(deadline) if isinstance(deadline, (int, float)) and deadline > 0 else None
        return mcp_loop_run(lambda: prompts_list(tenant_id, targets, deadline))
    if not targets:
        return {"error": "MCP server not found.", "code": "not_found"}
    target = targets[0]
    if op == "get":
        return mcp_loop_run(lambda: prompt_get(tenant_id, target, str(request.get("prompt", "")),
                                               request.get("arguments") or {}))
    if op == "complete":
        return mcp_loop_run(lambda: prompt_complete(
            tenant_id, target, str(request.get("prompt", "")), str(request.get("argument", "")),
            str(request.get("value", "")), request.get("context") or {}))
    return {"error": f"Unknown request {op!r}.", "code": "invalid"}


def mcp_prompts_reply(*, tenant_id: int, user_id: int | None, request: dict[str, Any], reply_key: str) -> None:
    """The task ``capabilities.mcp_prompts_request``: answer ``request`` (:func:`mcp_prompts_answer`)
    and push the JSON answer to the Redis list ``reply_key`` (kept 5 minutes). An unexpected
    failure is answered too (``{error, code: "internal"}``), so the web process never waits out
    its timeout for a crash."""
    import redis
    from django.conf import settings

    try:
        answer = mcp_prompts_answer(tenant_id=tenant_id, user_id=user_id, request=request)
    except Exception:  # noqa: BLE001 - logged; the person gets a message instead of a timeout
        logger.exception("MCP prompts request %r of tenant %s failed", request.get("op"), tenant_id)
        answer = {"error": "The MCP request failed on the worker.", "code": "internal"}
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        with client.pipeline() as pipe:
            pipe.rpush(reply_key, json.dumps(answer))
            pipe.expire(reply_key, REPLY_TTL_SECONDS)
            pipe.execute()
    finally:
        client.close()
