"""The worker's side of ``GET /api/v1/agents/<id>/resources/`` (:mod:`sessions.api.resources`):
list the resources and resource templates of an agent's bound MCP servers for one member,
through the worker's MCP pool (:func:`capabilities.mcp_worker.mcp_loop_run`: the loop and warm
sessions runs use, listings cached until the server says they changed), keep those matching
the query, and push the answer to the Redis list the web process waits on (the task
``capabilities.mcp_resources_request`` calls :func:`mcp_resources_reply`).

Servers are reached as :func:`capabilities.commands.worker.server_targets` reaches them for the
chat's prompts: an ``oauth_user`` server with the member's own connection (none: the server is
in ``errors`` with where to connect, never listed with someone else's), ``oauth_tenant`` with
the tenant's. A server that cannot be reached is in ``errors``; the others are still listed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from capabilities.tools import ToolError

logger = logging.getLogger(__name__)

MAX_LISTED = 200
"""The most items one answer holds (the picker shows the first few; the query narrows)."""
REPLY_TTL_SECONDS = 300
"""How long an answer nobody read stays in Redis."""


async def resources_listed(tenant_id: int, targets: list[Any], query: str) -> dict[str, Any]:
    """The resources of ``targets`` (:class:`~capabilities.commands.worker.ServerTarget`) matching
    ``query``, the servers listed concurrently.

    Args:
        query: Words that must all be in an item's name, title, URI or description ("": all).

    Returns:
        ``{"results": [{server_id, server, uri, name, title, description, mime_type, size,
        template}], "errors": [{server_id, server, error}]}``: at most :data:`MAX_LISTED`
        results, in the targets' order, each server's resources before its templates.
    """
    from capabilities.mcp.pool import mcp_pool

    async def one(target: Any) -> tuple[list[dict[str, Any]], str]:
        if target.config is None:
            return [], target.error
        session = mcp_pool().session(tenant_id=tenant_id, server_id=target.server_id, config=target.config)
        try:
            catalogue = await session.resources.list()
        except ToolError as exc:
            return [], exc.message[:500]
        return [{"server_id": target.server_id, "server": target.alias, **item.as_json()}
                for item in catalogue.search(query)], ""

    listed = await asyncio.gather(*(one(target) for target in targets))
    results = [item for items, _ in listed for item in items]
    errors = [{"server_id": target.server_id, "server": target.alias, "error": error}
              for target, (_, error) in zip(targets, listed, strict=True) if error]
    return {"results": results[:MAX_LISTED], "errors": errors}


def mcp_resources_answer(*, tenant_id: int, user_id: int | None, server_ids: list[int], query: str) -> dict[str, Any]:
    """Answer one listing on this worker (:func:`resources_listed` over the enabled servers among
    ``server_ids``). Enters the tenant's scope itself."""
    from capabilities.commands.worker import server_targets
    from capabilities.mcp_worker import mcp_loop_run
    from tenants.scoping import tenant_scope

    with tenant_scope(tenant_id):
        targets = server_targets(tenant_id=tenant_id, user_id=user_id,
                                 server_ids=[i for i in server_ids if type(i) is int])
    order = {server_id: index for index, server_id in enumerate(server_ids)}
    targets.sort(key=lambda target: order.get(target.server_id, len(order)))
    return mcp_loop_run(lambda: resources_listed(tenant_id, targets, query))


def mcp_resources_reply(*, tenant_id: int, user_id: int | None, server_ids: list[int], query: str,
                        reply_key: str) -> None:
    """The task ``capabilities.mcp_resources_request``: answer (:func:`mcp_resources_answer`) and
    push the JSON answer to the Redis list ``reply_key`` (kept 5 minutes). An unexpected failure
    is answered too (an ``errors`` entry), so the web process never waits out its timeout."""
    import redis
    from django.conf import settings

    try:
        answer = mcp_resources_answer(tenant_id=tenant_id, user_id=user_id, server_ids=server_ids, query=query)
    except Exception:  # noqa: BLE001 - logged; the person gets a message instead of a timeout
        logger.exception("MCP resources listing of tenant %s failed", tenant_id)
        answer = {"results": [], "errors": [{"server_id": None, "server": "", "error": "The listing failed on the worker."}]}
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        with client.pipeline() as pipe:
            pipe.rpush(reply_key, json.dumps(answer))
            pipe.expire(reply_key, REPLY_TTL_SECONDS)
            pipe.execute()
    finally:
        client.close()
