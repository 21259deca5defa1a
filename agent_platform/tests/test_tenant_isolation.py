"""The cross-tenant matrix: every endpoint, called with another tenant's token, answers 404
(never data, never 403 that would confirm the object exists).

``theirs`` holds one row of every tenant-owned model, owned by the other tenant;
:func:`test_every_tenant_owned_model_is_in_the_matrix` fails when a new tenant-owned model is
neither there nor in :data:`EXEMPT` with a reason. Underneath the endpoints,
:func:`test_row_level_security_hides_every_row_of_theirs` reads and writes each of those rows
with raw SQL in this tenant's scope and gets nothing. ``test_tenant_isolation_app_layer.py``
runs the same matrix again with row-level security opened (the application layer alone).
"""

from __future__ import annotations

import datetime

import pytest
from django.apps import apps
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.utils import timezone

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory, ProviderFactory, RouteEntryFactory
from capabilities.cli.models import CliCommand
from capabilities.models import McpServer, Skill
from documents.models import Document
from knowledge.models import Chunk as KnowledgeChunk
from knowledge.models import Document as KnowledgeDocument
from knowledge.models import KnowledgeBase
from knowledge.tests import builders as kb_builders
from memory.models import Memory, MemoryExtraction
from memory.tests.factories import memory_make
from sessions.models import (
    Approval,
    Artifact,
    ChatSession,
    Compaction,
    LLMCall,
    LLMCallBody,
    Message,
    PinnedResource,
    Run,
    Todo,
    ToolCall,
    UsageMonth,
)
from tenants import rls
from tenants.models import AuditEvent, Invitation
from tenants.scoping import TenantOwnedModel, tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

EXEMPT: dict[type, str] = {}
"""Tenant-owned models that ``theirs`` does not make, each with the reason (none today)."""


@pytest.fixture
def theirs(other_world):
    """One of everything, owned by the other tenant."""
    t = other_world.tenant
    entry = RouteEntryFactory(tenant=t)
    agent = AgentFactory(tenant=t, route=entry.route)
    server = McpServer.all_tenants.create(tenant=t, name="srv", alias="srv", transport="streamable_http",
                                          url="https://mcp.example.com/mcp")
    binding = CapabilityBinding.all_tenants.create(tenant=t, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server)
    skill = Skill.all_tenants.create(tenant=t, name="their-skill", description="secret", instructions="secret")
    session = ChatSession.all_tenants.create(tenant=t, agent=agent, user=other_world.member, title="secret title")
    run = Run.all_tenants.create(tenant=t, session=session, user=other_world.member, input="secret input")
    Message.all_tenants.create(tenant=t, session=session, run=run, role="user", content="secret input", position=0)
    artifact = Artifact.all_tenants.create(tenant=t, session=session, run=run, name="secret.txt",
                                           mime_type="text/plain", size_bytes=6, content=b"secret")
    document = Document.all_tenants.create(tenant=t, session=session, created_by_run=run, title="secret doc",
                                           content="secret content")
    tool_call = ToolCall.all_tenants.create(tenant=t, run=run, turn=0, call_id="c1", name="secret_tool")
    soon = timezone.now() + datetime.timedelta(hours=1)
    knowledge_base = kb_builders.knowledge_base(t, "secret kb")
    kb_document = kb_builders.document(knowledge_base, "secret kb doc")
    [chunk] = kb_builders.chunks(kb_document, ["secret chunk text"], [kb_builders.unit([1.0] + [0.0] * 383)])
    from browser.models import BrowserDevice

    rows = {
        "provider": entry.provider, "route": entry.route, "agent": agent, "server": server,
        "binding": binding, "session": session, "run": run, "artifact": artifact, "document": document,
        "skill": skill, "route_entry": entry, "tool_call": tool_call,
        "message": Message.all_tenants.get(run=run),
        "llm_call": LLMCall.all_tenants.create(tenant=t, run=run, turn=0, attempt=1, route_entry=entry, entry_index=0,
                                               provider_name="p", model="m", status="ok"),
        "todo": Todo.all_tenants.create(tenant=t, session=session, position=0, content="secret todo"),
        "pinned_resource": PinnedResource.all_tenants.create(tenant=t, session=session, mcp_server=server,
                                                             uri="doc://secret/pinned"),
        "compaction": Compaction.all_tenants.create(tenant=t, session=session, run=run, attempt=1, status="done",
                                                    summary="secret summary"),
        "approval": Approval.all_tenants.create(tenant=t, run=run, tool_call=tool_call, tool_name="secret_tool",
                                                expires_at=soon),
        "cli_command": CliCommand.all_tenants.create(tenant=t, name="secret-cli"),
        "invitation": Invitation.all_tenants.create(tenant=t, username="secret-invitee", token_hash="1" * 64,
                                                    prefix="api_1", expires_at=soon),
        "membership": other_world.member_membership,
        "api_token": other_world.member_membership.api_tokens.first(),
        "audit_event": AuditEvent.all_tenants.create(tenant=t, action="secret.action", source="system"),
        "browser_device": BrowserDevice.all_tenants.create(tenant=t, user=other_world.member, name="secret laptop",
                                                           token_prefix="apd_y", token_hash="2" * 64),
        "knowledge_base": knowledge_base, "kb_document": kb_document, "chunk": chunk,
        "memory": memory_make(tenant=t, user=other_world.member, agent=agent, text="secret memory"),
        "memory_extraction": MemoryExtraction.all_tenants.create(tenant=t, session=session, last_message_id=1),
    }
    rows["usage_month"] = UsageMonth.all_tenants.get(tenant=t)  # written by the LLM call's trigger
    rows["llm_call_body"] = LLMCallBody.all_tenants.create(
        tenant=t, llm_call=rows["llm_call"], request='{"messages": "secret prompt"}', created_at=timezone.now())
    from agents.models import AgentVersion

    rows["agent_version"] = AgentVersion.all_tenants.get(tenant=t, agent=agent, number=1)  # recorded on save
    from capabilities.a2a.models import A2aAgent

    rows["a2a_agent"] = A2aAgent.all_tenants.create(tenant=t, name="secret remote",
                                                    card_url="https://agents.example.com/.well-known/agent-card.json")
    rows["a2a_binding"] = CapabilityBinding.all_tenants.create(tenant=t, agent=agent, kind="a2a",
                                                               config={"a2a_agent": rows["a2a_agent"].pk})
    from capabilities.mcp_oauth.models import McpOAuthConnection

    rows["oauth_mcp_server"] = McpServer.all_tenants.create(
        tenant=t, name="secret oauth server", alias="secretoauth", transport="streamable_http",
        url="https://mcp.example.com/mcp", auth_mode="oauth_user")
    rows["mcp_oauth_connection"] = McpOAuthConnection.all_tenants.create(
        tenant=t, server=rows["oauth_mcp_server"], user=other_world.member, status="connected",
        access_token_encrypted="secret", scope="secret-scope")
    from capabilities.commands.models import Command

    rows["command"] = Command.all_tenants.create(tenant=t, name="their-command", description="secret",
                                                 template="secret template")
    rows["command_binding"] = CapabilityBinding.all_tenants.create(tenant=t, agent=agent, kind="command",
                                                                   config={"command": rows["command"].pk})
    from evaluation.models import Dataset, DatasetItem, Experiment, ExperimentResult

    rows["dataset"] = Dataset.all_tenants.create(tenant=t, name="secret dataset")
    rows["dataset_item"] = DatasetItem.all_tenants.create(tenant=t, dataset=rows["dataset"], input="secret question")
    rows["experiment"] = Experiment.all_tenants.create(tenant=t, dataset=rows["dataset"], agent=agent,
                                                       created_by=other_world.admin)
    rows["experiment_result"] = ExperimentResult.all_tenants.create(
        tenant=t, experiment=rows["experiment"], item=rows["dataset_item"], run=run, output="secret answer")
    from oauth2_provider.models import Application

    from oauth_server.models import McpGrant

    client = Application.objects.create(name="secret client", client_type="public", redirect_uris="http://127.0.0.1:9/cb",
                                        authorization_grant_type="authorization-code")
    rows["oauth_grant"] = McpGrant.all_tenants.create(
        tenant=t, membership=other_world.member_membership, application=client, scope="mcp",
        resource="http://testserver/mcp/agents/", token_family="2f1c2a3e-0000-4000-8000-000000000001")
    from automations.models import InboundWebhook, Schedule, ScheduleSlot, WebhookTrigger

    rows["schedule"] = Schedule.all_tenants.create(tenant=t, agent=agent, owner=other_world.member, cron="0 8 * * *",
                                                   timezone="Europe/Berlin", message="secret schedule")
    rows["schedule_slot"] = ScheduleSlot.all_tenants.create(tenant=t, schedule=rows["schedule"], slot_time=soon, run=run)
    rows["webhook_trigger"] = WebhookTrigger.all_tenants.create(tenant=t, agent=agent, owner=other_world.member,
                                                                secret_encrypted="secret")
    rows["inbound_webhook"] = InboundWebhook.all_tenants.create(tenant=t, trigger=rows["webhook_trigger"],
                                                                webhook_id="msg_secret", run=run, chat=session)
    from automations.models import DeliveryAttempt, WebhookDelivery, WebhookSubscription

    rows["webhook_subscription"] = WebhookSubscription.all_tenants.create(
        tenant=t, url="https://hooks.example.com/secret", event_types=["run.completed"], secret_encrypted="secret")
    rows["webhook_delivery"] = WebhookDelivery.all_tenants.create(
        tenant=t, subscription=rows["webhook_subscription"], event_type="run.completed", message_id="msg_secret_out",
        payload={"secret": True}, retry_until=soon)
    rows["delivery_attempt"] = DeliveryAttempt.all_tenants.create(tenant=t, delivery=rows["webhook_delivery"],
                                                                  status_code=200)
    from sessions.models import TaskPushConfig

    rows["task_push_config"] = TaskPushConfig.all_tenants.create(
        tenant=t, run=run, config_id="secret", url="https://hooks.example.com/a2a", base_url="http://testserver")
    rows["a2a_push_delivery"] = WebhookDelivery.all_tenants.create(
        tenant=t, push_config=rows["task_push_config"], event_type="a2a.task", message_id="msg_secret_push",
        payload={"task": {"id": str(run.pk)}}, retry_until=soon)
    from guardrails.models import Guardrail

    rows["guardrail"] = Guardrail.all_tenants.create(tenant=t, agent=agent, name="secret guardrail", point="output",
                                                     kind="deny_list", config={"words": ["secret"]})
    return rows


def _tenant_owned_models() -> set[type]:
    return {m for m in apps.get_models() if issubclass(m, TenantOwnedModel) and not m._meta.abstract}


def test_every_tenant_owned_model_is_in_the_matrix(theirs):
    """A new tenant-owned model must get a row in ``theirs`` (so the row-level test below reads
    it, and its endpoints get a test here) or an entry in ``EXEMPT`` saying why not."""
    covered = {type(obj) for obj in theirs.values()}
    missing = {m._meta.label for m in _tenant_owned_models() - covered - set(EXEMPT)}
    assert not missing, f"tenant-owned models not in the cross-tenant matrix (add them to `theirs`): {sorted(missing)}"
    assert not covered & set(EXEMPT), "a model is both covered and exempt"
    assert all(reason.strip() for reason in EXEMPT.values())
    assert {KnowledgeBase, KnowledgeDocument, KnowledgeChunk, Memory, MemoryExtraction} <= covered


def test_row_level_security_hides_every_row_of_theirs(world, theirs):
    """Underneath the application: in this tenant's scope, raw SQL (no ORM filter) neither sees
    nor changes any of the other tenant's rows, table by table."""
    with tenant_scope(world.tenant.pk), connection.cursor() as cursor:
        for name, obj in theirs.items():
            table = type(obj)._meta.db_table
            cursor.execute(f'SELECT COUNT(*) FROM "{table}" WHERE "id" = %s', [obj.pk])
            assert cursor.fetchone()[0] == 0, f"{name} ({table}) is visible"
            if table in rls.append_only_tables():  # the role may not UPDATE these at all (the audit log)
                with pytest.raises(DatabaseError, match="permission denied"), transaction.atomic():
                    cursor.execute(f'UPDATE "{table}" SET "tenant_id" = "tenant_id" WHERE "id" = %s', [obj.pk])
                continue
            cursor.execute(f'UPDATE "{table}" SET "tenant_id" = "tenant_id" WHERE "id" = %s', [obj.pk])
            assert cursor.rowcount == 0, f"{name} ({table}) is writable"


def _assert_404(response):
    assert response.status_code == 404, response.content
    body = response.json()
    assert set(body) == {"message", "extra"}
    assert "secret" not in response.content.decode()


def test_end_user_endpoints_hide_other_tenants_objects(world, theirs):
    client = world.client()
    _assert_404(client.get(f"/api/v1/sessions/{theirs['session'].pk}/"))
    _assert_404(client.post(f"/api/v1/sessions/{theirs['session'].pk}/messages/", {"content": "hi"}, format="json"))
    _assert_404(client.get(f"/api/v1/runs/{theirs['run'].pk}/"))
    _assert_404(client.get(f"/api/v1/runs/{theirs['run'].pk}/activities/"))
    _assert_404(client.get(f"/api/v1/sessions/{theirs['session'].pk}/artifacts/"))
    _assert_404(client.get(f"/api/v1/artifacts/{theirs['artifact'].pk}/"))
    _assert_404(client.get(f"/api/v1/artifacts/{theirs['artifact'].pk}/content"))
    _assert_404(client.get(f"/api/v1/documents/{theirs['document'].pk}/"))
    assert client.get("/api/v1/documents/").json()["results"] == []
    assert client.get(f"/api/v1/documents/?session={theirs['session'].pk}").json()["results"] == []
    _assert_404(client.post("/api/v1/sessions/", {"agent": theirs["agent"].pk}, format="json"))
    listed = client.get("/api/v1/agents/").json()["results"]
    assert theirs["agent"].pk not in [a["id"] for a in listed]
    _assert_404(client.get(f"/api/v1/agents/{theirs['agent'].pk}/commands/"))
    _assert_404(client.post(f"/api/v1/agents/{theirs['agent'].pk}/commands/their-command/render/", {}, format="json"))
    _assert_404(client.get(f"/api/v1/agents/{theirs['agent'].pk}/commands/their-command/complete/?argument=x"))
    _assert_404(client.get(f"/api/v1/agents/{theirs['agent'].pk}/resources/?q=x"))  # MCP resources to attach
    pins = f"/api/v1/sessions/{theirs['session'].pk}/pinned-resources/"  # MCP resources pinned to a chat
    _assert_404(client.get(pins))
    _assert_404(client.post(pins, {"server": "srv", "uri": "doc://x"}, format="json"))
    _assert_404(client.delete(f"{pins}{theirs['pinned_resource'].pk}/"))
    assert client.get("/api/v1/sessions/").json()["results"] == []


@pytest.mark.django_db(transaction=True)  # async views: their database work runs in another thread
def test_openai_compatible_endpoints_hide_other_tenants_agents_and_chats(world, theirs):
    """/api/openai/v1: their agent's slug is "not found" like a missing one, as a model and to
    chat with; their chat cannot be continued, even through an agent of ours with the same slug."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {world.member_token}")
    slug = theirs["agent"].slug
    assert slug not in [m["id"] for m in client.get("/api/openai/v1/models").json()["data"]]
    ask = {"model": slug, "messages": [{"role": "user", "content": "hi"}]}
    for response in (client.get(f"/api/openai/v1/models/{slug}"),
                     client.post("/api/openai/v1/chat/completions", ask, content_type="application/json")):
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
        assert "secret" not in response.content.decode()
    AgentFactory(tenant=world.tenant, slug=slug)
    continued = client.post("/api/openai/v1/chat/completions", {**ask, "metadata": {"chat_id": str(theirs["session"].pk)}},
                            content_type="application/json")
    assert continued.status_code == 404 and continued.json()["error"]["code"] == "chat_not_found"
    assert list(Run.all_tenants.filter(session=theirs["session"])) == [theirs["run"]]


KB_NOT_FOUND = {"message": "Knowledge base not found.", "extra": {}}


def _knowledge_calls(client, kb, doc, chunk) -> list[tuple[str, object]]:
    """Every knowledge endpoint on ``kb``/``doc``/``chunk``: ``[(what, response)]``."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    base = f"/api/v1/knowledge-bases/{kb.pk}/"
    upload = SimpleUploadedFile("secret.md", b"# Secret\n\nuploaded", content_type="text/markdown")
    return [
        ("kb detail", client.get(base)),
        ("kb update", client.patch(base, {"name": "hijacked"}, format="json")),
        ("document list", client.get(base + "documents/")),
        ("document add (text)", client.post(base + "documents/", {"text": "x", "title": "t"}, format="json")),
        ("document upload (file)", client.post(base + "documents/", {"file": upload}, format="multipart")),
        ("document detail", client.get(base + f"documents/{doc.pk}/")),
        ("document reingest", client.post(base + f"documents/{doc.pk}/reingest/")),
        ("document delete", client.delete(base + f"documents/{doc.pk}/")),
        ("search", client.post(base + "search/", {"query": "secret"}, format="json")),
        ("chunk", client.get(f"/api/v1/knowledge/chunks/{chunk.pk}/")),
        ("kb delete", client.delete(base)),
    ]


def _assert_knowledge_hidden(client, kb, doc, chunk) -> None:
    for what, response in _knowledge_calls(client, kb, doc, chunk):
        _assert_404(response)
        expected = "Chunk not found." if what == "chunk" else "Knowledge base not found."
        assert response.json()["message"] == expected, what
    listed = client.get("/api/v1/knowledge-bases/").json()["results"]
    assert kb.pk not in [k["id"] for k in listed]


def _assert_knowledge_untouched(kb, doc, chunk) -> None:
    kb.refresh_from_db()
    assert kb.name != "hijacked"
    assert KnowledgeDocument.all_tenants.filter(knowledge_base=kb).count() == 1
    assert KnowledgeDocument.all_tenants.get(pk=doc.pk).generation == doc.generation  # no re-ingestion queued
    assert KnowledgeChunk.all_tenants.filter(pk=chunk.pk).exists()


@pytest.fixture
def no_ingest_task(monkeypatch):
    """Ingestion is not handed to Celery (none may be queued here anyway)."""
    sent = []
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: sent.append(kwargs))
    return sent


def test_knowledge_endpoints_hide_other_tenants_objects(world, theirs, no_ingest_task):
    kb, doc, chunk = theirs["knowledge_base"], theirs["kb_document"], theirs["chunk"]
    for client in (world.client(), world.client(admin=True)):
        _assert_knowledge_hidden(client, kb, doc, chunk)
    _assert_knowledge_untouched(kb, doc, chunk)
    assert no_ingest_task == []


def test_knowledge_mcp_tools_hide_other_tenants_knowledge_bases(world, theirs):
    """The knowledge MCP server's tools (knowledge/mcp_server.py; its HTTP side is tested in
    knowledge/tests/test_mcp_server.py): another tenant's knowledge base is neither listed nor
    searchable, with the words of a missing one."""
    from knowledge.mcp_server import McpCaller, knowledge_bases_list, knowledge_search_call

    kb = theirs["knowledge_base"]
    for user in (world.member, world.admin):
        caller = McpCaller(tenant_id=world.tenant.pk, user_id=user.pk)
        assert knowledge_bases_list(caller) == []
        refused = knowledge_search_call(caller, {"query": "secret", "knowledge_base_ids": [kb.pk]})
        assert refused.is_error and refused.content[0].text.startswith(f"No knowledge base with id {kb.pk} ")
        everything = knowledge_search_call(caller, {"query": "secret"})
        assert not everything.is_error and everything.structured_content["hits"] == []


def test_knowledge_search_filters_naming_other_tenants_documents_find_nothing(world, theirs, no_ingest_task):
    """A search of one's own knowledge base limited to another tenant's document ids: no hit
    (and no embedding request: the filter leaves nothing to search)."""
    mine = kb_builders.knowledge_base(world.tenant, "mine")
    kb_builders.chunks(kb_builders.document(mine, "my doc"), ["secret chunk text"],
                       [kb_builders.unit([1.0] + [0.0] * 383)])
    response = world.client(admin=True).post(f"/api/v1/knowledge-bases/{mine.pk}/search/",
                                             {"query": "secret", "document_ids": [theirs["kb_document"].pk]},
                                             format="json")
    assert response.status_code == 200, response.content
    assert response.json()["hits"] == []


def test_console_test_search_hides_other_tenants_knowledge_base(world, theirs):
    console = Client()
    console.force_login(world.admin)
    kb = theirs["knowledge_base"]
    for url in (f"/admin/knowledge/knowledgebase/{kb.pk}/change/",
                f"/admin/knowledge/knowledgebase/{kb.pk}/test-search/?query=secret",
                f"/admin/knowledge/knowledgebase/{kb.pk}/add-documents/"):
        response = console.get(url)
        assert response.status_code in (302, 404), url  # the admin redirects a missing object to its list
        assert b"secret" not in response.content, url
    assert b"secret kb" not in console.get("/admin/knowledge/knowledgebase/").content


def test_memory_endpoints_hide_other_tenants_memories(world, theirs, monkeypatch):
    sent = []
    monkeypatch.setattr("memory.tasks.memory_extract_session.delay", lambda *args: sent.append(args))
    memory, agent = theirs["memory"], theirs["agent"]
    for client in (world.client(), world.client(admin=True)):
        _assert_404(client.delete(f"/api/v1/memories/{memory.pk}/"))
        assert client.get("/api/v1/memories/").json()["results"] == []
        _assert_404(client.get(f"/api/v1/memories/?agent={agent.pk}"))
        _assert_404(client.delete(f"/api/v1/memories/?agent={agent.pk}"))
        _assert_404(client.post("/api/v1/memories/extract/", {"session": theirs["session"].pk}, format="json"))
    assert Memory.all_tenants.filter(pk=memory.pk).exists()
    assert sent == []


def test_another_members_own_knowledge_base_and_memories_are_hidden(world, no_ingest_task):
    """Within one tenant: a member's own knowledge base (its documents, chunks) and their
    memories are 404 to another member, whatever that member's role; the list leaves them out."""
    agent = AgentFactory(tenant=world.tenant)
    for owner, other in ((world.member, world.client(admin=True)), (world.admin, world.client())):
        kb = kb_builders.knowledge_base(world.tenant, f"secret own of {owner.username}", owner=owner)
        doc = kb_builders.document(kb, "secret own doc")
        [chunk] = kb_builders.chunks(doc, ["secret own text"], [kb_builders.unit([1.0] + [0.0] * 383)])
        _assert_knowledge_hidden(other, kb, doc, chunk)
        _assert_knowledge_untouched(kb, doc, chunk)
        memory = memory_make(tenant=world.tenant, user=owner, agent=agent, text=f"secret of {owner.username}")
        _assert_404(other.delete(f"/api/v1/memories/{memory.pk}/"))
        assert memory.pk not in [m["id"] for m in other.get("/api/v1/memories/").json()["results"]]
        assert memory.pk not in [m["id"] for m in other.get(f"/api/v1/memories/?agent={agent.pk}").json()["results"]]
        other.delete(f"/api/v1/memories/?agent={agent.pk}")  # forgets the caller's own only
        assert Memory.all_tenants.filter(pk=memory.pk).exists()
    assert no_ingest_task == []


def test_knowledge_search_filters_naming_another_members_documents_find_nothing(world):
    """The ``knowledge_search`` tool's path (``knowledge.tools.search_sync``): a member's run may
    search the tenant-wide knowledge base and their own; document ids (and knowledge base ids)
    of another member's own knowledge base are ignored, never searched."""
    from knowledge.retrieval import search
    from knowledge.tools import SearchScope, search_sync

    vector = kb_builders.unit([1.0] + [0.0] * 383)
    shared = kb_builders.knowledge_base(world.tenant, "shared")
    shared_doc = kb_builders.document(shared, "shared doc")
    kb_builders.chunks(shared_doc, ["public passage about backups"], [vector])
    admins = kb_builders.knowledge_base(world.tenant, "admin's own", owner=world.admin)
    admins_doc = kb_builders.document(admins, "admin's doc")
    kb_builders.chunks(admins_doc, ["secret passage about backups"], [vector])

    scope = SearchScope(tenant_id=world.tenant.pk, knowledge_base_ids=(shared.pk,), user_id=world.member.pk)
    with tenant_scope(world.tenant.pk):
        assert search_sync(scope, query="backups", top_k=5, document_ids=[admins_doc.pk]) == []
    hits = search(tenant_id=world.tenant.pk, knowledge_base_ids=[shared.pk, admins.pk], query="backups",
                  user_id=world.member.pk, document_ids=[shared_doc.pk, admins_doc.pk], query_vector=vector)
    assert [h.document_id for h in hits] == [shared_doc.pk]
    assert "secret" not in repr(hits)
    # the admin's own run finds their own passage through the same call (the filter is not just empty)
    hits = search(tenant_id=world.tenant.pk, knowledge_base_ids=[shared.pk, admins.pk], query="backups",
                  user_id=world.admin.pk, document_ids=[shared_doc.pk, admins_doc.pk], query_vector=vector)
    assert sorted(h.document_id for h in hits) == sorted([shared_doc.pk, admins_doc.pk])


def test_browser_device_endpoints_hide_other_tenants_devices(world, other_world):
    from browser.models import BrowserDevice

    device = BrowserDevice.all_tenants.create(tenant=other_world.tenant, user=other_world.member, name="secret laptop",
                                              token_prefix="apd_x", token_hash="0" * 64)
    for client in (world.client(), world.client(admin=True)):
        _assert_404(client.get(f"/api/v1/browser/devices/{device.pk}/"))
        _assert_404(client.delete(f"/api/v1/browser/devices/{device.pk}/"))
        assert client.get("/api/v1/browser/devices/").json()["results"] == []
    device.refresh_from_db()
    assert device.revoked_at is None


def test_agent_version_endpoints_hide_other_tenants_agents(world, theirs):
    client = world.client(admin=True)
    base = f"/api/v1/admin/agents/{theirs['agent'].pk}"
    _assert_404(client.get(f"{base}/versions/"))
    _assert_404(client.get(f"{base}/versions/1/diff/?against=1"))
    _assert_404(client.post(f"{base}/publish/", {}, format="json"))
    _assert_404(client.post(f"{base}/rollback/", {"version": 1}, format="json"))
    theirs["agent"].refresh_from_db()
    assert theirs["agent"].published_version_id is None


def test_mcp_connection_endpoints_hide_other_tenants_servers(world, theirs):
    """The caller's OAuth connections to MCP servers (capabilities/mcp_oauth): another tenant's
    server is neither listed nor connectable, and its connection cannot be disconnected."""
    server, connection = theirs["oauth_mcp_server"], theirs["mcp_oauth_connection"]
    for client in (world.client(), world.client(admin=True)):
        assert client.get("/api/v1/mcp-connections/").json() == []
        _assert_404(client.post(f"/api/v1/mcp-connections/{server.pk}/connect/", {}, format="json"))
        _assert_404(client.delete(f"/api/v1/mcp-connections/{server.pk}/"))
    assert McpServer.all_tenants.filter(pk=server.pk).exists()
    connection.refresh_from_db()
    assert connection.status == "connected"


def test_missing_and_foreign_objects_get_the_same_message(world, theirs):
    client = world.client()
    foreign = client.get(f"/api/v1/runs/{theirs['run'].pk}/").json()
    missing = client.get("/api/v1/runs/999999/").json()
    assert foreign == missing == {"message": "Run not found.", "extra": {}}


@pytest.mark.parametrize("kind", ["providers", "routes", "agents", "mcp-servers", "bindings", "skills", "datasets",
                                  "a2a-agents", "guardrails", "commands"])
def test_admin_endpoints_hide_other_tenants_objects(world, theirs, kind):
    key = {"providers": "provider", "routes": "route", "agents": "agent", "mcp-servers": "server",
           "bindings": "binding", "skills": "skill", "datasets": "dataset", "a2a-agents": "a2a_agent",
           "guardrails": "guardrail", "commands": "command"}[kind]
    client = world.client(admin=True)
    url = f"/api/v1/admin/{kind}/{theirs[key].pk}/"
    _assert_404(client.get(url))
    _assert_404(client.patch(url, {"name": "hijacked"}, format="json"))
    _assert_404(client.delete(url))
    listed = client.get(f"/api/v1/admin/{kind}/").json()["results"]
    assert theirs[key].pk not in [item["id"] for item in listed]


def test_admin_cannot_point_at_other_tenants_objects(world, theirs):
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/guardrails/", {"agent": theirs["agent"].pk, "name": "g", "point": "output",
                                                     "kind": "max_length", "config": {"max_chars": 9}}, format="json")
    assert resp.status_code == 400 and "agent" in resp.json()["extra"]["fields"]
    resp = client.post("/api/v1/admin/agents/", {"name": "x", "route": theirs["route"].pk}, format="json")
    assert resp.status_code == 400
    assert "route" in resp.json()["extra"]["fields"]
    mine = AgentFactory(tenant=world.tenant)
    resp = client.post(
        "/api/v1/admin/bindings/",
        {"agent": mine.pk, "kind": "mcp_server", "mcp_server": theirs["server"].pk}, format="json",
    )
    assert resp.status_code == 400
    assert "mcp_server" in resp.json()["extra"]["fields"]
    resp = client.post("/api/v1/admin/bindings/", {"agent": mine.pk, "kind": "skill", "skill": theirs["skill"].pk},
                       format="json")
    assert resp.status_code == 400
    assert "skill" in resp.json()["extra"]["fields"] and "secret" not in resp.content.decode()
    resp = client.post("/api/v1/admin/bindings/", {"agent": mine.pk, "kind": "a2a",
                                                   "config": {"a2a_agent": theirs["a2a_agent"].pk}}, format="json")
    assert resp.status_code == 400
    assert "config" in resp.json()["extra"]["fields"] and "secret" not in resp.content.decode()
    resp = client.post("/api/v1/admin/bindings/", {"agent": mine.pk, "kind": "command",
                                                   "config": {"command": theirs["command"].pk}}, format="json")
    assert resp.status_code == 400
    assert resp.json()["extra"]["fields"]["config"] == ["Command not found."]
    resp = client.post("/api/v1/admin/skills/", {"name": "s", "description": "d", "instructions": "i",
                                                 "model_route": theirs["route"].pk}, format="json")
    assert resp.status_code == 400
    assert "model_route" in resp.json()["extra"]["fields"]


@pytest.mark.parametrize("kind", ["providers", "routes", "agents", "mcp-servers", "bindings", "skills", "a2a-agents",
                                  "guardrails", "commands"])
def test_members_get_403_on_admin_endpoints(world, kind):
    resp = world.client().get(f"/api/v1/admin/{kind}/")
    assert resp.status_code == 403
    assert resp.json()["message"] == "Only tenant owners and admins may do this."


def test_unauthenticated_and_revoked_tokens_are_refused(world, client):
    assert client.get("/api/v1/agents/").status_code in (401, 403)
    bad = world.client()
    bad.credentials(HTTP_AUTHORIZATION="Bearer ap_not-a-token")
    resp = bad.get("/api/v1/agents/")
    assert resp.status_code == 401
    assert resp.json() == {"message": "Invalid or revoked token.", "extra": {}}


def test_token_revoke_of_another_members_token_is_404(world, other_world):
    token_id = other_world.member_membership.api_tokens.first().pk
    _assert_404(world.client().post(f"/api/v1/tokens/{token_id}/revoke/"))


def test_provider_api_key_is_write_only_and_encrypted(world):
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/providers/",
                       {"name": "openai", "base_url": "https://api.example.com/v1", "api_key": "sk-abc"}, format="json")
    assert resp.status_code == 201, resp.content
    assert "api_key" not in resp.json() and resp.json()["has_api_key"] is True
    from llm.models import ModelProvider
    row = ModelProvider.all_tenants.get(pk=resp.json()["id"])
    assert row.api_key_encrypted and "sk-abc" not in row.api_key_encrypted


def test_route_with_entries_round_trips(world):
    client = world.client(admin=True)
    p = ProviderFactory(tenant=world.tenant)
    resp = client.post("/api/v1/admin/routes/", {
        "name": "main",
        "entries": [
            {"provider": p.pk, "model": "big", "max_input_tokens": 128000, "tool_calls": "native"},
            {"provider": p.pk, "model": "small", "max_input_tokens": 8192, "tool_calls": "text"},
        ],
    }, format="json")
    assert resp.status_code == 201, resp.content
    got = client.get(f"/api/v1/admin/routes/{resp.json()['id']}/").json()
    assert [(e["model"], e["position"]) for e in got["entries"]] == [("big", 0), ("small", 1)]


def test_deleting_a_route_in_use_is_a_409_with_a_message(world):
    agent = AgentFactory(tenant=world.tenant)
    resp = world.client(admin=True).delete(f"/api/v1/admin/routes/{agent.route_id}/")
    assert resp.status_code == 409
    assert resp.json() == {"message": "This object is in use and cannot be deleted.", "extra": {"used_by": [f"agent {agent.pk}"]}}


def test_agents_mcp_server_hides_other_tenants_agents_and_chats(world, theirs):
    """The agents' MCP server (sessions/api/mcp_agents.py; its HTTP side with the mcp SDK in
    sessions/tests/test_mcp_agents.py): their agent is not a tool of ours and cannot be called
    (the protocol's unknown tool), their chat cannot be continued, even through an agent of ours
    with the same slug, and their token's calls are not ours to cancel."""
    from sessions.api.agent_runs import AGENT_NOT_FOUND, RunRefused
    from sessions.api.mcp_agents import CallAsk, agent_tools, agent_usable, call_start, cancelled_notification
    from tenants.resolution import caller_resolve

    slug = theirs["agent"].slug
    for token in (world.member_token, world.admin_token):
        caller = caller_resolve(raw_token=token)
        assert slug not in [tool.name for tool in agent_tools(caller)] and not agent_usable(caller, slug)
        with pytest.raises(RunRefused) as refused:
            call_start(caller, slug, CallAsk(message="hi", chat_id=None))
        assert refused.value.code == AGENT_NOT_FOUND and "secret" not in refused.value.message
        assert cancelled_notification(caller, 1) is False
    AgentFactory(tenant=world.tenant, slug=slug)
    caller = caller_resolve(raw_token=world.member_token)
    assert slug in [tool.name for tool in agent_tools(caller)]
    with pytest.raises(RunRefused) as refused:
        call_start(caller, slug, CallAsk(message="hi", chat_id=theirs["session"].pk))
    assert refused.value.code == "chat_not_found"
    assert list(Run.all_tenants.filter(session=theirs["session"])) == [theirs["run"]]


def test_oauth_grants_hide_other_tenants_grants(world, theirs):
    """Settings' connected apps (/api/v1/oauth-grants/): another tenant's grant is neither listed
    nor revocable, for a member or an admin; it stays. (Its tokens at the MCP endpoints:
    oauth_server/tests/test_mcp_sdk_oauth.py.)"""
    from oauth_server.models import McpGrant

    grant = theirs["oauth_grant"]
    for client in (world.client(), world.client(admin=True)):
        assert client.get("/api/v1/oauth-grants/").json() == []
        _assert_404(client.delete(f"/api/v1/oauth-grants/{grant.pk}/"))
    assert McpGrant.all_tenants.filter(pk=grant.pk).exists()
