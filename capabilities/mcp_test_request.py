"""The web side of an MCP server's Test connection (the console's button): send the test to a
worker and wait for its answer (:func:`mcp_server_test_connection_request`).

The worker's side is the task ``capabilities.mcp_server_test_connection``
(:mod:`capabilities.tasks`), which runs :func:`capabilities.services.mcp_server_test_connection_reply`.
This module sits above both (it sends the task), so neither imports it back.
"""

from __future__ import annotations

import json
import uuid

import redis
from django.conf import settings

from capabilities.mcp.operations import McpToolInfo
from capabilities.models import McpServer
from capabilities.services import McpConnectionTest
from capabilities.tasks import mcp_server_test_connection as task


def mcp_server_test_connection_request(*, server: McpServer, wait_seconds: float | None = None) -> McpConnectionTest:
    """Have a worker test ``server`` (:func:`capabilities.services.mcp_server_test_connection`) and
    wait for its answer.

    The test runs in a Celery worker, never in the calling (web) process. The worker pushes its
    result to a one-off Redis list that this call waits on (``BLPOP``).

    Args:
        server: The server (the caller already checked it is the tenant's).
        wait_seconds: How long to wait (default ``settings.MCP_TEST_CONNECTION_WAIT_SECONDS``).

    Returns:
        The worker's result, or a failed result saying that no worker answered in time.
    """
    wait = settings.MCP_TEST_CONNECTION_WAIT_SECONDS if wait_seconds is None else wait_seconds
    reply_key = f"{settings.REDIS_KEY_PREFIX}:mcp-test:{uuid.uuid4().hex}"
    task.apply_async(kwargs={"tenant_id": server.tenant_id, "server_id": server.pk, "reply_key": reply_key})
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=wait + 5)
    try:
        reply = client.blpop([reply_key], timeout=max(1, int(wait)))
    finally:
        client.close()
    if reply is None:
        return McpConnectionTest(
            ok=False, error=f"No worker answered within {wait:g} s: is a Celery worker running? "
                            "Tests run on a worker, never in the web process.")
    data = json.loads(reply[1])
    tools = tuple(McpToolInfo(name=t["name"], description=t["description"], input_schema=t["input_schema"])
                  for t in data.get("tools", ()))
    return McpConnectionTest(ok=data["ok"], tools=tools, error=data.get("error", ""), seconds=data.get("seconds", 0.0))
