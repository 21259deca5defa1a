"""The knowledge bases' MCP server (/mcp/knowledge/) on the real ASGI app (uvicorn), spoken to
by the platform's own MCP client (the mcp SDK's Streamable HTTP client): a token sees its
tenant's and its own user's knowledge bases and nothing else; no token, a bad one or a revoked
one is a 401; bad arguments are tool errors with the reason."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.tools import ToolError
from knowledge.ingestion import document_ingest
from knowledge.models import Document
from knowledge.services import document_add_text
from knowledge.tests import builders
from tenants.scoping import tenant_scope
from tenants.services import api_token_revoke

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _ready(kb, title: str, text: str) -> Document:
    with tenant_scope(kb.tenant_id):
        document = document_add_text(knowledge_base=kb, title=title, text=text).document
        document_ingest(document_id=document.pk, generation=document.generation)
        document.refresh_from_db()
    assert document.status == "ready", document.status_reason
    return document


def _config(live_server_url: str, token: str) -> McpServerConfig:
    return McpServerConfig(alias="kb", transport="streamable_http", url=f"{live_server_url}/mcp/knowledge/",
                           headers={"Authorization": f"Bearer {token}"}, connect_timeout_seconds=20.0)


def _call(live_server_url: str, token: str, tool: str, arguments: dict):
    async def go():
        async with McpConnection(_config(live_server_url, token)) as connection:
            return await connection.call_tool(tool, arguments, timeout_seconds=60)

    return asyncio.run(go())


@pytest.fixture
def knowledge(world, other_world, embedding_server, no_ingest_task):
    """Acme: a tenant-wide handbook and the member's own notes, the admin's own notes; Other:
    a tenant-wide handbook with the same words."""
    handbook = builders.knowledge_base(world.tenant, "Handbook", base_url=embedding_server)
    mine = builders.knowledge_base(world.tenant, "My notes", owner=world.member, base_url=embedding_server)
    admins = builders.knowledge_base(world.tenant, "Admin notes", owner=world.admin, base_url=embedding_server)
    theirs = builders.knowledge_base(other_world.tenant, "Handbook", base_url=embedding_server)
    _ready(handbook, "Harbour rules", "# Harbour rules\n\n## Mooring\n\nBoats moor at the east pontoon after six.")
    _ready(mine, "My mooring", "I keep my dinghy at the west slipway on Sundays.")
    _ready(admins, "Admin mooring", "The harbour master's boat moors at berth nine.")
    _ready(theirs, "Other harbour", "Boats moor at the north quay in the other tenant's harbour.")
    return {"handbook": handbook, "mine": mine, "admins": admins, "theirs": theirs}


def test_a_client_lists_and_searches_what_its_token_may_see(world, knowledge, live_server_url):
    token = world.member_token

    async def listed():
        async with McpConnection(_config(live_server_url, token)) as connection:
            return await connection.list_tools()

    tools = asyncio.run(listed())
    assert [tool.name for tool in tools] == ["knowledge_bases", "knowledge_search"]
    assert tools[1].input_schema["required"] == ["query"]

    kbs = _call(live_server_url, token, "knowledge_bases", {})
    assert [(kb["name"], kb["tenant_wide"], kb["documents"]) for kb in kbs.data["knowledge_bases"]] == [
        ("Handbook", True, 1), ("My notes", False, 1)]
    assert "Handbook (1 documents)" in kbs.content

    found = _call(live_server_url, token, "knowledge_search", {"query": "where do boats moor", "top_k": 5})
    titles = [hit["document_title"] for hit in found.data["hits"]]
    assert set(titles) == {"Harbour rules", "My mooring"}  # not the admin's own, not the other tenant's
    first = found.data["hits"][0]
    assert first["n"] == 1 and first["text"] and first["chunk_id"] and "snippet" not in first
    assert found.content.startswith('<untrusted-data nonce="') and '">\n[1] ' in found.content
    assert found.data["notice"] == ""

    only_handbook = _call(live_server_url, token, "knowledge_search",
                          {"query": "mooring", "knowledge_base_ids": [knowledge["handbook"].pk]})
    assert {hit["knowledge_base_id"] for hit in only_handbook.data["hits"]} == {knowledge["handbook"].pk}


def test_another_tenants_and_another_users_knowledge_bases_are_refused_alike(world, knowledge, live_server_url):
    for kb in (knowledge["theirs"], knowledge["admins"]):
        with pytest.raises(ToolError) as refused:
            _call(live_server_url, world.member_token, "knowledge_search",
                  {"query": "moor", "knowledge_base_ids": [kb.pk]})
        assert str(refused.value).endswith(f"No knowledge base with id {kb.pk} (ask knowledge_bases for the ones "
                                           "you may search).")
    missing = 10**9
    with pytest.raises(ToolError) as refused:
        _call(live_server_url, world.member_token, "knowledge_search", {"query": "moor", "knowledge_base_ids": [missing]})
    assert f"No knowledge base with id {missing} " in str(refused.value)


def test_the_other_tenants_token_finds_only_its_own_passages(other_world, knowledge, live_server_url):
    found = _call(live_server_url, other_world.member_token, "knowledge_search", {"query": "where do boats moor"})
    assert [hit["document_title"] for hit in found.data["hits"]] == ["Other harbour"]


@pytest.mark.parametrize(("arguments", "reason"), [
    ({}, "query must be a non-empty string"),
    ({"query": "moor", "top_k": 0}, "top_k must be an integer from 1 to 20"),
    ({"query": "moor", "knowledge_base_ids": "1"}, "knowledge_base_ids must be a list of integer ids"),
    ({"query": "moor", "filters": {"colour": ["red"]}}, "Unknown filters ['colour']"),
    ({"query": "moor", "keyword": "x"}, "Unknown arguments ['keyword']"),
])
def test_bad_arguments_are_tool_errors_with_the_reason(world, knowledge, live_server_url, arguments, reason):
    with pytest.raises(ToolError) as refused:
        _call(live_server_url, world.member_token, "knowledge_search", arguments)
    assert reason in str(refused.value)


def test_no_token_a_bad_token_and_a_revoked_token_are_401(world, live_server_url):
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    url = f"{live_server_url}/mcp/knowledge/"
    none = httpx.post(url, json=initialize, headers=headers)
    assert none.status_code == 401
    assert none.json()["message"].startswith("Authentication credentials were not provided")
    assert none.headers["www-authenticate"].startswith("Bearer")
    bad = httpx.post(url, json=initialize, headers={**headers, "Authorization": "Bearer ap_nottoken"})
    assert (bad.status_code, bad.json()) == (401, {"message": "Invalid or revoked token.", "extra": {}})

    good = httpx.post(url, json=initialize, headers={**headers, "Authorization": f"Bearer {world.member_token}"})
    assert good.status_code == 200, good.text
    assert good.json()["result"]["serverInfo"]["name"] == "agent-platform-knowledge"
    # Stateless: a call needs no session (the README's curl example).
    listed = httpx.post(url, headers={**headers, "Authorization": f"Bearer {world.member_token}",
                                      "MCP-Protocol-Version": "2025-06-18"},
                        json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                              "params": {"name": "knowledge_bases", "arguments": {}}})
    assert listed.status_code == 200, listed.text
    assert listed.json()["result"]["structuredContent"] == {"knowledge_bases": []}

    token_row = world.member_membership.api_tokens.get()
    api_token_revoke(token=token_row)
    revoked = httpx.post(url, json=initialize, headers={**headers, "Authorization": f"Bearer {world.member_token}"})
    assert revoked.status_code == 401


def test_searches_are_throttled_per_user_over_rest_and_mcp_alike(world, knowledge, settings):
    """REST and MCP searches spend one budget (``search.*``): each embeds its query."""
    from knowledge.mcp_server import McpCaller, knowledge_search_call

    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "search.user": "2/minute"}
    url = f"/api/v1/knowledge-bases/{knowledge['handbook'].pk}/search/"
    member = world.client()
    mcp = McpCaller(tenant_id=world.tenant.pk, user_id=world.member.pk)
    assert "query must be" in knowledge_search_call(mcp, {"query": ""}).content[0].text  # spends nothing
    assert member.post(url, {"query": "moor"}, format="json").status_code == 200
    assert not knowledge_search_call(mcp, {"query": "moor"}).is_error
    refused = knowledge_search_call(mcp, {"query": "moor"})
    assert refused.is_error and refused.content[0].text.startswith("Too many searches: try again in ")
    throttled = member.post(url, {"query": "moor"}, format="json")
    assert throttled.status_code == 429 and "Retry-After" in throttled
    # Another user of the tenant has a budget of their own.
    admin = McpCaller(tenant_id=world.tenant.pk, user_id=world.admin.pk)
    assert not knowledge_search_call(admin, {"query": "moor"}).is_error
