"""MCP resources in the chat: what a member may attach (``GET /api/v1/agents/<id>/resources/?q=``)
and the ``resources`` of a posted message (:func:`message_resources`).

Listing talks to the agent's MCP servers, which the web process never does: the request goes to
a worker (task ``capabilities.mcp_resources_request``), which lists through its MCP pool
(:mod:`capabilities.mcp.server_resources`: the warm sessions runs use, listings cached until the
server says they changed) and answers on a one-off Redis list this view waits on, as the
chat's MCP prompts (:mod:`capabilities.commands.requests`) and the console's Test connection do.

A posted message's resources are checked by :func:`sessions.chat_services.message_resources`
(``message_resources`` is re-exported here for the message view), without asking the server.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from agents.selectors import agent_get_active
from sessions.chat_services import bound_mcp_servers, message_resources
from tenants.api.mixins import TenantScopedApiView

MAX_QUERY_CHARS = 200


def resources_request(*, tenant_id: int, user_id: int, agent_id: int, query: str,
                      wait_seconds: float | None = None) -> dict[str, Any]:
    """Have a worker list the resources of the agent's bound, enabled MCP servers for the member
    and wait for it (the caller's tenant scope).

    Returns:
        ``{"results": [{server, binding, uri, ...}], "errors": [{server, error}]}`` (see
        :func:`capabilities.mcp.server_resources.resources_listed`; ``binding``: the agent's
        binding of the item's server, to post with a message).

    Raises:
        ApplicationError: 503 when no worker answered within ``MCP_TEST_CONNECTION_WAIT_SECONDS``.
    """
    import redis

    from capabilities.tasks import mcp_resources_request

    bindings = {b.mcp_server_id: b.pk for b in reversed(bound_mcp_servers(agent_id=agent_id))}  # the first binding of a server
    if not bindings:
        return {"results": [], "errors": []}
    wait = settings.MCP_TEST_CONNECTION_WAIT_SECONDS if wait_seconds is None else wait_seconds
    reply_key = f"{settings.REDIS_KEY_PREFIX}:mcp-resources:{uuid.uuid4().hex}"
    mcp_resources_request.apply_async(kwargs={"tenant_id": tenant_id, "user_id": user_id, "query": query,
                                              "server_ids": sorted(bindings, key=bindings.__getitem__),
                                              "reply_key": reply_key})
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=wait + 5)
    try:
        reply = client.blpop([reply_key], timeout=max(1, int(wait)))
    finally:
        client.close()
    if reply is None:
        raise ApplicationError("No worker answered in time; try again in a moment.", status_code=503)
    answer = json.loads(reply[1])
    results = [{"server": r.pop("server"), "binding": bindings.get(r.pop("server_id")), **r}
               for r in answer.get("results", ())]
    errors = [{"server": e.get("server", ""), "error": e.get("error", "")} for e in answer.get("errors", ())]
    return {"results": results, "errors": errors}


_ITEM = {
    "server": serializers.CharField(help_text="The MCP server's name (its alias)."),
    "binding": serializers.IntegerField(help_text="The agent's binding of that server (post it with the message)."),
    "uri": serializers.CharField(help_text="The resource's URI; for a template, its RFC 6570 URI template."),
    "name": serializers.CharField(),
    "title": serializers.CharField(),
    "description": serializers.CharField(),
    "mime_type": serializers.CharField(),
    "size": serializers.IntegerField(allow_null=True, help_text="Bytes, when the server says."),
    "template": serializers.BooleanField(help_text="A template: fill its {variables} in before attaching."),
}


class AgentResourceListApi(TenantScopedApiView):
    """The resources (and resource templates) of an agent's bound MCP servers that the caller may
    attach to a message, searched by ``q`` (every word in the name, title, URI or description).

    Any member of the agent's tenant; ``oauth_user`` servers are listed with the caller's own
    connection (not connected: named in ``errors``). Another tenant's agent, or an inactive
    one, is a 404. A server that cannot be reached is in ``errors``, the others are listed."""

    @extend_schema(
        parameters=[OpenApiParameter("q", str, description="Search words (at most 200 characters).")],
        responses={200: inline_serializer("AgentResourceList", {
            "results": inline_serializer("AgentResource", _ITEM, many=True),
            "errors": inline_serializer("AgentResourceError", {"server": serializers.CharField(),
                                                               "error": serializers.CharField()}, many=True),
        })},
    )
    def get(self, request: Request, agent_id: int) -> Response:
        agent = agent_get_active(agent_id=agent_id)
        if agent is None:
            raise NotFound("Agent not found.")
        query = (request.query_params.get("q") or "").strip()[:MAX_QUERY_CHARS]
        answer = resources_request(tenant_id=agent.tenant_id, user_id=request.user.pk, agent_id=agent.pk, query=query)
        return Response(answer)


__all__ = ["AgentResourceListApi", "message_resources", "resources_request"]
