"""The web side of the chat app's MCP prompts: send a request to a worker and wait for its
answer (:func:`mcp_prompts_request`). The worker's side is :mod:`capabilities.commands.worker`
(the task ``capabilities.mcp_prompts_request``). This module sits above both (it sends the
task), as :mod:`capabilities.mcp_test_request` does for the console's Test connection."""

from __future__ import annotations

import json
import uuid
from typing import Any

import redis
from django.conf import settings

from capabilities.tasks import mcp_prompts_request as task


def mcp_prompts_request(*, tenant_id: int, user_id: int | None, request: dict[str, Any],
                        wait_seconds: float | None = None) -> dict[str, Any]:
    """Have a worker answer ``request`` and wait for the answer (``BLPOP`` on a one-off Redis list).

    Requests (``servers`` / ``server``: ``McpServer`` ids of the tenant; others find nothing):

    - ``{op: "list", servers: [id, ...]}`` → ``{servers: [{server_id, alias, prompts: [{name,
      title, description, arguments: [{name, description, required}]}], error}]}`` (a server
      that has not answered within three quarters of the wait is named with an error, so the
      others' prompts arrive in time);
    - ``{op: "get", server, prompt, arguments: {name: value}}`` → ``{description, messages:
      [{role, content}]}`` (the MCP ``PromptMessage`` s as JSON);
    - ``{op: "complete", server, prompt, argument, value, context: {name: value}}`` →
      ``{values: [str], has_more}``.

    A failure is ``{error, code}`` (``not_found``, ``invalid_arguments`` with ``missing`` /
    ``unknown``, ``mcp_unavailable``, ``timeout``, ``mcp_error``, ...); no answer within
    ``wait_seconds`` (default ``settings.MCP_PROMPTS_WAIT_SECONDS``) is ``{error, code:
    "no_worker"}``. Never raises for the server's or the worker's failures.
    """
    wait = settings.MCP_PROMPTS_WAIT_SECONDS if wait_seconds is None else wait_seconds
    reply_key = f"{settings.REDIS_KEY_PREFIX}:mcp-prompts:{uuid.uuid4().hex}"
    if request.get("op") == "list":  # a slow server is named, not the whole answer lost
        request = {**request, "deadline_seconds": max(1.0, wait * 0.75)}
    task.apply_async(kwargs={"tenant_id": tenant_id, "user_id": user_id, "request": request, "reply_key": reply_key})
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=wait + 5)
    try:
        reply = client.blpop([reply_key], timeout=max(1, int(wait)))
    finally:
        client.close()
    if reply is None:
        return {"error": f"No worker answered within {wait:g} s: is a Celery worker running?", "code": "no_worker"}
    return json.loads(reply[1])
