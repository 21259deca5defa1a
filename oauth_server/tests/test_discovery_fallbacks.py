"""The well-known URLs an MCP client probes when it does not follow the 401's
``resource_metadata`` pointer (MCP authorization 2025-11-25, "Protected Resource Metadata
Discovery Requirements" and "Authorization Server Metadata Discovery"): the root protected-resource
document and OpenID discovery. Both are a JSON 404 (never the chat app's HTML), the root one
naming the per-endpoint documents; see docs/operations-security.md for why."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = [pytest.mark.django_db]

BASE = "http://testserver"


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/"])
def test_the_root_protected_resource_document_is_a_json_404_naming_the_endpoints(path):
    response = Client().get(path)
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"] == "not_found"
    assert body["resource_metadata"] == [
        f"{BASE}/.well-known/oauth-protected-resource/mcp/agents/",
        f"{BASE}/.well-known/oauth-protected-resource/mcp/knowledge/",
    ]


def test_openid_discovery_is_a_json_404_and_the_oauth_document_is_served():
    """Not an OpenID provider (no ID tokens): clients try RFC 8414 first, which answers."""
    response = Client().get("/.well-known/openid-configuration")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"] == "not_found"
    assert Client().get("/.well-known/oauth-authorization-server").status_code == 200
