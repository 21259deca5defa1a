"""Celery tasks of capabilities: thin wrappers over :mod:`capabilities.services`."""

from __future__ import annotations

from celery import shared_task

from capabilities.services import mcp_server_test_connection_reply


@shared_task(name="capabilities.mcp_server_test_connection", ignore_result=True, time_limit=300)
def mcp_server_test_connection(*, tenant_id: int, server_id: int, reply_key: str) -> None:
    """Test MCP server ``server_id`` of tenant ``tenant_id`` on this worker and push the result
    to the Redis list ``reply_key`` (see :func:`capabilities.mcp_test_request.mcp_server_test_connection_request`)."""
    mcp_server_test_connection_reply(tenant_id=tenant_id, server_id=server_id, reply_key=reply_key)


@shared_task(name="capabilities.mcp_prompts_request", ignore_result=True, time_limit=300)
def mcp_prompts_request(*, tenant_id: int, user_id: int | None, request: dict, reply_key: str) -> None:
    """Answer the chat app's MCP prompts ``request`` (list, get, complete) for tenant
    ``tenant_id``'s member ``user_id`` on this worker, and push the answer to the Redis list
    ``reply_key`` (see :func:`capabilities.commands.requests.mcp_prompts_request`)."""
    from capabilities.commands.worker import mcp_prompts_reply

    mcp_prompts_reply(tenant_id=tenant_id, user_id=user_id, request=request, reply_key=reply_key)


@shared_task(name="capabilities.mcp_resources_request", ignore_result=True, time_limit=300)
def mcp_resources_request(*, tenant_id: int, user_id: int | None, server_ids: list[int], query: str,
                          reply_key: str) -> None:
    """List the resources of MCP servers ``server_ids`` of tenant ``tenant_id`` for member
    ``user_id`` matching ``query`` on this worker, and push the answer to the Redis list
    ``reply_key`` (see :func:`sessions.api.resources.resources_request`)."""
    from capabilities.mcp.server_resources import mcp_resources_reply

    mcp_resources_reply(tenant_id=tenant_id, user_id=user_id, server_ids=server_ids, query=query, reply_key=reply_key)
