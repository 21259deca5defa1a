"""The doc_write tool: each op, its errors, and who sees which documents."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.tests.factories import AgentFactory
from capabilities.builtin.registry import builtin_create
from capabilities.tools import ToolContext, ToolError
from documents.models import Document
from sessions.models import ChatSession, Run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


class Caller:
    """A run in a fresh session of ``user``; ``call(**arguments)`` runs doc_write as that run."""

    def __init__(self, tenant, user):
        agent = AgentFactory(tenant=tenant)
        self.tenant_id = tenant.pk
        self.user_id = user.pk
        self.session = ChatSession.all_tenants.create(tenant=tenant, agent=agent, user=user)
        self.run = Run.all_tenants.create(tenant=tenant, session=self.session, user=user, input="x")
        self.events: list[tuple[str, dict]] = []

    async def _publish(self, type_, data):
        self.events.append((type_, data))

    async def call(self, **arguments):
        context = ToolContext(tenant_id=self.tenant_id, session_id=self.session.pk, run_id=self.run.pk,
                              tool_call_id=1, publish=self._publish, user_id=self.user_id)
        with tenant_scope(self.tenant_id):
            return await builtin_create("doc_write").execute(arguments, context)

    async def error(self, **arguments) -> ToolError:
        with pytest.raises(ToolError) as info:
            await self.call(**arguments)
        return info.value


caller = sync_to_async(Caller)


@sync_to_async
def stored(document_id):
    return Document.all_tenants.get(pk=document_id)


async def test_create_append_get_and_list(world):
    me = await caller(world.tenant, world.member)
    created = await me.call(op="create", title="Trip plan", content="# Trip plan\n\n## Day 1\n\nMuseum.")
    doc_id = created.data["document_id"]
    assert created.content == f"Created document:{doc_id} «Trip plan» (version 1, 5 lines)."
    assert me.events == [("artifact_updated", {"document_id": doc_id, "title": "Trip plan", "op": "create",
                                               "version": 1})]

    appended = await me.call(op="append", id=doc_id, content="## Day 2\n\nBeach.")
    assert appended.data["version"] == 2
    row = await stored(doc_id)
    assert row.content == "# Trip plan\n\n## Day 1\n\nMuseum.\n## Day 2\n\nBeach."
    assert (row.session_id, row.created_by_run_id, row.updated_by_run_id, row.tenant_id) == (
        me.session.pk, me.run.pk, me.run.pk, world.tenant.pk)

    whole = await me.call(op="get", id=doc_id)
    assert whole.content.startswith(f"document:{doc_id} «Trip plan», version 2, lines 1–8 of 8:\n\n# Trip plan")
    section = await me.call(op="get", id=doc_id, section="Day 1")
    assert section.content.endswith("lines 3–5 of 8:\n\n## Day 1\n\nMuseum.")
    lines = await me.call(op="get", id=doc_id, line_start=6, line_end=6)
    assert lines.content.endswith("lines 6–6 of 8:\n\n## Day 2")

    listed = await me.call(op="list")
    assert [d["document_id"] for d in listed.data] == [doc_id]
    assert f"document:{doc_id} «Trip plan» (version 2" in listed.content and "this session" in listed.content
    assert [e[1]["op"] for e in me.events] == ["create", "append"]


async def test_patch_by_section_and_by_text(world):
    me = await caller(world.tenant, world.member)
    doc_id = (await me.call(op="create", title="R", content="# R\n\n## A\n\nold a\n\n## B\n\nold b\n")).data["document_id"]
    patched = await me.call(op="patch", id=doc_id, section="A", content="new a")
    assert patched.data["version"] == 2
    assert (await stored(doc_id)).content == "# R\n\n## A\n\nnew a\n\n## B\n\nold b\n"
    await me.call(op="patch", id=doc_id, old_text="old b", new_text="new b")
    row = await stored(doc_id)
    assert (row.content, row.version) == ("# R\n\n## A\n\nnew a\n\n## B\n\nnew b\n", 3)
    assert [e[1]["op"] for e in me.events] == ["create", "patch", "patch"]


async def test_errors_are_clear_and_change_nothing(world):
    me = await caller(world.tenant, world.member)
    doc_id = (await me.call(op="create", title="D", content="x\nx\n## S\n")).data["document_id"]
    cases = [
        ({"op": "delete"}, "invalid_arguments", "`op` must be one of"),
        ({"op": "get", "id": 999999}, "not_found", "There is no document 999999"),
        ({"op": "append", "id": 999999, "content": "y"}, "not_found", "There is no document"),
        ({"op": "append", "id": "abc", "content": "y"}, "invalid_arguments", "`id` must be an integer"),
        ({"op": "create", "title": "", "content": "y"}, "invalid_arguments", "`title`"),
        ({"op": "create", "title": "t" * 201}, "invalid_arguments", "at most 200"),
        ({"op": "patch", "id": doc_id, "old_text": "x", "new_text": "y"}, "ambiguous", "occurs 2 times"),
        ({"op": "patch", "id": doc_id, "old_text": "zzz", "new_text": "y"}, "not_found", "was not found"),
        ({"op": "patch", "id": doc_id, "section": "Nope", "content": "y"}, "not_found", "No section"),
        ({"op": "patch", "id": doc_id, "content": "y"}, "invalid_arguments", "needs either"),
        ({"op": "get", "id": doc_id, "section": "S", "line_start": 1}, "invalid_arguments", "not both"),
        ({"op": "get", "id": doc_id, "line_start": 50}, "invalid_arguments", "only 3 lines"),
        ({"op": "append", "id": doc_id, "content": "z" * 1_000_001}, "too_large", "at most 1,000,000"),
    ]
    for arguments, code, text in cases:
        error = await me.error(**arguments)
        assert (error.code, text in error.message) == (code, True), (arguments, error.message)
    row = await stored(doc_id)
    assert (row.content, row.version) == ("x\nx\n## S\n", 1)
    assert len(me.events) == 1


async def test_documents_are_shared_across_a_users_sessions_but_not_with_others(world, other_world):
    mine = await caller(world.tenant, world.member)
    my_other_session = await caller(world.tenant, world.member)
    colleague = await caller(world.tenant, world.admin)
    stranger = await caller(other_world.tenant, other_world.member)
    doc_id = (await mine.call(op="create", title="Mine", content="secret")).data["document_id"]

    assert (await my_other_session.call(op="get", id=doc_id)).content.endswith("secret")
    for outsider in (colleague, stranger):
        for arguments in ({"op": "get", "id": doc_id}, {"op": "append", "id": doc_id, "content": "x"},
                          {"op": "patch", "id": doc_id, "old_text": "secret", "new_text": "mine now"}):
            error = await outsider.error(**arguments)
            assert error.code == "not_found" and "secret" not in error.message
        assert (await outsider.call(op="list")).data == []
    assert (await stored(doc_id)).content == "secret"


async def test_documents_of_a_deleted_chat_leave_the_users_other_runs(world):
    """A deleted chat is gone for its user everywhere (README, "Deleted chats"): a run in another
    chat neither lists nor reads its documents; Undo brings them back."""
    from django.utils import timezone

    gone = await caller(world.tenant, world.member)
    current = await caller(world.tenant, world.member)
    doc_id = (await gone.call(op="create", title="Old plan", content="from the deleted chat")).data["document_id"]
    await sync_to_async(ChatSession.all_tenants.filter(pk=gone.session.pk).update)(deleted_at=timezone.now())
    assert (await current.error(op="get", id=doc_id)).code == "not_found"
    assert (await current.call(op="list")).data == []
    await sync_to_async(ChatSession.all_tenants.filter(pk=gone.session.pk).update)(deleted_at=None)
    assert (await current.call(op="get", id=doc_id)).content.endswith("from the deleted chat")


async def test_concurrent_writes_are_serialised(world):
    import asyncio

    me = await caller(world.tenant, world.member)
    doc_id = (await me.call(op="create", title="Log", content="start")).data["document_id"]
    results = await asyncio.gather(*(me.call(op="append", id=doc_id, content=f"line {i}") for i in range(8)))
    row = await stored(doc_id)
    assert sorted(r.data["version"] for r in results) == list(range(2, 10))
    assert row.version == 9
    assert sorted(row.content.split("\n")) == sorted(["start"] + [f"line {i}" for i in range(8)])
