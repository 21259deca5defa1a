"""The chat app's chat management endpoints (sessions/api/chats.py): search and badges, rename,
soft delete and Undo, edit-and-resend and retry (truncation), a new chat with a summary,
attachments, the member's usage; each with another user's and another tenant's objects (404)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from agents.tests.factories import agent_with_route
from sessions.chat_services import chat_title_from
from sessions.models import Approval, Artifact, ChatSession, LLMCall, Message, Run, RunStatus, ToolCall
from sessions.services import chat_session_create, message_post
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def agent(world):
    return agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"], name="Helper")


def _chat(world, agent, *messages, user=None, finish=True):
    """A session of ``user`` (default: the member) with one finished run per message."""
    user = user or world.member
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=user, agent=agent)
        runs = []
        for text in messages:
            run = message_post(session=session, user=user, content=text)
            if finish:
                Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED, reply=f"answer to {text}")
                Message.objects.create(tenant_id=session.tenant_id, session=session, run=run, role="assistant",
                                       content=f"answer to {text}", position=session.next_position + len(runs) + 100)
            runs.append(run)
        session.refresh_from_db()
    return session, runs


def test_title_heuristic():
    assert chat_title_from("**Plan** a trip to `Kyoto` in May") == "Plan a trip to Kyoto in May"
    long = "Please write a detailed comparison of the three largest cloud providers for a small team"
    title = chat_title_from(long)
    assert title.endswith("…") and len(title) <= 61 and long.startswith(title[:-1])
    assert chat_title_from("\n\n[attachment: artifact:3 \"a.txt\", text/plain, 3 B]\nsummarise this") == "summarise this"
    assert chat_title_from("   ") == ""


def test_search_titles_and_content_and_badges(world, agent, no_enqueue):
    s1, _ = _chat(world, agent, "Trip to Kyoto")
    s2, _ = _chat(world, agent, "Budget for Q3")
    Message.all_tenants.filter(session=s2, role="assistant").update(content="The kyoto office costs more.")
    s3, [running] = _chat(world, agent, "Something else", finish=False)
    client = world.client()

    found = client.get("/api/v1/sessions/?q=KYOTO").json()
    assert {r["id"] for r in found["results"]} == {s1.pk, s2.pk}
    assert client.get("/api/v1/sessions/?q=nothing-like-this").json()["results"] == []

    rows = {r["id"]: r for r in client.get("/api/v1/sessions/").json()["results"]}
    assert rows[s3.pk]["activity"] == "running" and rows[s1.pk]["activity"] is None
    active = client.get("/api/v1/sessions/?activity=active").json()["results"]
    assert [r["id"] for r in active] == [s3.pk]
    assert client.get("/api/v1/sessions/?activity=bogus").status_code == 400
    # another user's chats are never found
    assert world.client(admin=True).get("/api/v1/sessions/?q=kyoto").json()["results"] == []


def test_search_ignores_superseded_answers(world, agent, no_enqueue):
    session, [run] = _chat(world, agent, "first question")
    Message.all_tenants.filter(session=session, role="assistant").update(content="zebra answer")
    client = world.client()
    assert client.get("/api/v1/sessions/?q=zebra").json()["count"] == 1
    assert client.post(f"/api/v1/runs/{run.pk}/retry/").status_code == 201
    assert client.get("/api/v1/sessions/?q=zebra").json()["count"] == 0


def test_rename_delete_restore(world, other_world, agent, no_enqueue):
    session, [run] = _chat(world, agent, "hello")
    client = world.client()
    r = client.patch(f"/api/v1/sessions/{session.pk}/", {"title": "  My trip  "}, format="json")
    assert r.status_code == 200 and r.json()["title"] == "My trip"
    assert client.patch(f"/api/v1/sessions/{session.pk}/", {"title": ""}, format="json").status_code == 400
    assert client.patch(f"/api/v1/sessions/{session.pk}/", {"title": "x" * 201}, format="json").status_code == 400

    # another member of the tenant, and another tenant, cannot rename, delete or restore it
    admin = world.client(admin=True)
    other = other_world.client()
    for c in (admin, other):
        assert c.patch(f"/api/v1/sessions/{session.pk}/", {"title": "mine"}, format="json").status_code == 404
        assert c.delete(f"/api/v1/sessions/{session.pk}/").status_code == 404
        assert c.post(f"/api/v1/sessions/{session.pk}/restore/").status_code == 404

    assert client.delete(f"/api/v1/sessions/{session.pk}/").status_code == 204
    assert ChatSession.all_tenants.get(pk=session.pk).deleted_at is not None  # kept, soft-deleted
    # gone from the list, the detail, its runs and messages
    assert client.get("/api/v1/sessions/").json()["results"] == []
    assert client.get(f"/api/v1/sessions/{session.pk}/").status_code == 404
    assert client.get(f"/api/v1/runs/{run.pk}/").status_code == 404
    assert client.post(f"/api/v1/sessions/{session.pk}/messages/", {"content": "hi"}, format="json").status_code == 404

    r = client.post(f"/api/v1/sessions/{session.pk}/restore/")
    assert r.status_code == 200 and r.json()["title"] == "My trip"
    assert [s["id"] for s in client.get("/api/v1/sessions/").json()["results"]] == [session.pk]


def test_deleting_a_chat_cancels_its_queued_run(world, agent, no_enqueue):
    session, [run] = _chat(world, agent, "hello", finish=False)
    assert world.client().delete(f"/api/v1/sessions/{session.pk}/").status_code == 204
    assert Run.all_tenants.get(pk=run.pk).status == "cancelled"


def test_edit_truncates_and_resends(world, agent, no_enqueue):
    session, [r1, r2, r3] = _chat(world, agent, "one", "two", "three")
    client = world.client()
    r = client.post(f"/api/v1/runs/{r2.pk}/edit/", {"content": "TWO, edited"}, format="json")
    assert r.status_code == 201, r.json()
    new_id = r.json()["run"]["id"]
    detail = client.get(f"/api/v1/sessions/{session.pk}/").json()
    assert [(x["id"], x["input"]) for x in detail["runs"]] == [(r1.pk, "one"), (new_id, "TWO, edited")]
    # the history the model sees: run one, then the edited message; two and three are gone
    contents = list(Message.all_tenants.filter(session=session).order_by("run_id", "position")
                    .values_list("content", flat=True))
    assert contents == ["one", "answer to one", "TWO, edited"]
    assert Run.all_tenants.filter(pk__in=[r2.pk, r3.pk], superseded_at__isnull=False).count() == 2
    # an active run blocks edits and retries (409), an empty edit is a 400
    assert client.post(f"/api/v1/runs/{r1.pk}/edit/", {"content": "x"}, format="json").status_code == 409
    Run.all_tenants.filter(pk=new_id).update(status="completed")
    assert client.post(f"/api/v1/runs/{r1.pk}/edit/", {"content": "  "}, format="json").status_code == 400
    assert client.post(f"/api/v1/runs/{r2.pk}/edit/", {"content": "again"}, format="json").status_code == 409


def test_retry_and_regenerate_only_the_last_run(world, agent, no_enqueue):
    session, [r1, r2] = _chat(world, agent, "one", "two")
    Run.all_tenants.filter(pk=r2.pk).update(status="failed", error="boom", reason="model_unavailable")
    client = world.client()
    assert client.post(f"/api/v1/runs/{r1.pk}/retry/").status_code == 409  # not the last one
    r = client.post(f"/api/v1/runs/{r2.pk}/retry/")
    assert r.status_code == 201 and r.json()["run"]["input"] == "two"
    Run.all_tenants.filter(pk=r.json()["run"]["id"]).update(status="completed")
    r = client.post(f"/api/v1/sessions/{session.pk}/regenerate/")
    assert r.status_code == 201 and r.json()["run"]["input"] == "two"
    runs = client.get(f"/api/v1/sessions/{session.pk}/").json()["runs"]
    assert [x["input"] for x in runs] == ["one", "two"] and runs[-1]["id"] == r.json()["run"]["id"]
    empty = _chat(world, agent)[0]
    assert client.post(f"/api/v1/sessions/{empty.pk}/regenerate/").status_code == 409


def test_edit_retry_regenerate_continue_404_for_others(world, other_world, agent, no_enqueue):
    session, [run] = _chat(world, agent, "mine")
    for c in (world.client(admin=True), other_world.client()):
        assert c.post(f"/api/v1/runs/{run.pk}/edit/", {"content": "x"}, format="json").status_code == 404
        assert c.post(f"/api/v1/runs/{run.pk}/retry/").status_code == 404
        assert c.post(f"/api/v1/sessions/{session.pk}/regenerate/").status_code == 404
        assert c.post(f"/api/v1/sessions/{session.pk}/continue/").status_code == 404
    assert Run.all_tenants.filter(session=session).count() == 1


def test_continue_with_a_summary(world, agent, no_enqueue):
    session, _ = _chat(world, agent, "Plan a trip to Kyoto", "What about hotels?")
    r = world.client().post(f"/api/v1/sessions/{session.pk}/continue/")
    assert r.status_code == 201
    body = r.json()
    assert body["session"]["id"] != session.pk and body["session"]["agent"]["id"] == agent.pk
    assert "User: Plan a trip to Kyoto" in body["draft"] and "Assistant: answer to What about hotels?" in body["draft"]
    assert not Run.all_tenants.filter(session_id=body["session"]["id"]).exists()  # nothing sent yet


def test_attachments_upload_reference_and_limits(world, other_world, agent, no_enqueue):
    session, _ = _chat(world, agent)
    client = world.client()
    r = client.post(f"/api/v1/sessions/{session.pk}/attachments/", {
        "file": [SimpleUploadedFile("notes.txt", b"line one\nline two\n", content_type="text/plain"),
                 SimpleUploadedFile("pic.png", b"\x89PNG\r\n\x1a\nxxxx", content_type="image/png")],
    }, format="multipart")
    assert r.status_code == 201, r.content
    notes, pic = r.json()
    assert notes["reference"] == (f'[attachment: artifact:{notes["id"]} "notes.txt", text/plain, 18 B]\n'
                                  "```\nline one\nline two\n```")
    assert pic["reference"] == f'[image: artifact:{pic["id"]} "pic.png", image/png, 12 B]'
    assert Artifact.all_tenants.filter(session=session).count() == 2
    listed = client.get(f"/api/v1/sessions/{session.pk}/artifacts/").json()
    assert [a["name"] for a in listed] == ["notes.txt", "pic.png"]

    with override_settings(ATTACHMENT_MAX_BYTES=10):
        r = client.post(f"/api/v1/sessions/{session.pk}/attachments/",
                        {"file": SimpleUploadedFile("big.bin", b"x" * 11)}, format="multipart")
    assert r.status_code == 413 and r.json()["extra"]["max_bytes"] == 10
    assert client.post(f"/api/v1/sessions/{session.pk}/attachments/", {}, format="multipart").status_code == 400
    r = client.post(f"/api/v1/sessions/{session.pk}/attachments/",
                    {"file": SimpleUploadedFile("empty.txt", b"")}, format="multipart")
    assert r.status_code == 400
    assert client.post(f"/api/v1/sessions/{session.pk}/attachments/", {"file": "x"}, format="json").status_code == 415
    # another user / tenant: 404, nothing stored; they cannot read the attachment either
    for c in (world.client(admin=True), other_world.client()):
        r = c.post(f"/api/v1/sessions/{session.pk}/attachments/",
                   {"file": SimpleUploadedFile("x.txt", b"x")}, format="multipart")
        assert r.status_code == 404
        assert c.get(f"/api/v1/artifacts/{notes['id']}/content").status_code == 404
    assert Artifact.all_tenants.filter(session=session).count() == 2


def test_usage_me_counts_only_the_callers_calls(world, other_world, agent, no_enqueue):
    mine, [run] = _chat(world, agent, "hello")
    theirs, [their_run] = _chat(world, agent, "hi", user=world.admin)
    for r, tokens in ((run, 100), (their_run, 7)):
        LLMCall.all_tenants.create(tenant=world.tenant, run=r, turn=0, agent_id=r.session.agent_id, user_id=r.user_id,
                                   attempt=1, entry_index=0, provider_name="p",
                                   model="m", status="succeeded", prompt_tokens=tokens, completion_tokens=tokens // 2,
                                   cost_usd_micros=tokens * 10)
    body = world.client().get("/api/v1/usage/me/").json()
    assert (body["llm_calls"], body["prompt_tokens"], body["completion_tokens"], body["cost_usd"]) == (
        1, 100, 50, "0.001000")
    assert body["by_agent"][0]["agent"] == "Helper"
    assert other_world.client().get("/api/v1/usage/me/").json()["llm_calls"] == 0
    assert world.client().get("/api/v1/usage/me/?month=2020-13").status_code == 400
    assert world.client().get("/api/v1/usage/me/?month=2001-01").json()["llm_calls"] == 0
    detail = world.client().get(f"/api/v1/sessions/{mine.pk}/").json()
    assert detail["usage"] == {"llm_calls": 1, "prompt_tokens": 100, "completion_tokens": 50, "cost_usd": "0.001000"}


def test_deleted_chats_hide_their_approvals(world, agent, no_enqueue):
    session, [run] = _chat(world, agent, "hello", finish=False)
    from django.utils import timezone

    call = ToolCall.all_tenants.create(tenant=world.tenant, run=run, turn=0, call_id="c1", name="x")
    approval = Approval.all_tenants.create(tenant=world.tenant, run=run, tool_call=call, tool_name="x",
                                           expires_at=timezone.now() + timezone.timedelta(hours=1))
    client = world.client()
    assert client.get(f"/api/v1/approvals/{approval.pk}/").status_code == 200
    ChatSession.all_tenants.filter(pk=session.pk).update(deleted_at=timezone.now())
    assert client.get(f"/api/v1/approvals/{approval.pk}/").status_code == 404


def test_deleted_chats_hide_their_documents(world, agent, no_enqueue):
    from documents.models import Document

    session, [run] = _chat(world, agent, "write it down")
    doc = Document.all_tenants.create(tenant=world.tenant, session=session, title="Notes", content="# Notes")
    client = world.client()
    assert [d["id"] for d in client.get("/api/v1/documents/").json()["results"]] == [doc.pk]
    assert client.get(f"/api/v1/documents/{doc.pk}/").status_code == 200
    assert client.delete(f"/api/v1/sessions/{session.pk}/").status_code == 204
    assert client.get("/api/v1/documents/").json()["results"] == []
    assert client.get(f"/api/v1/documents/{doc.pk}/").status_code == 404
    assert client.post(f"/api/v1/sessions/{session.pk}/restore/").status_code == 200
    assert client.get(f"/api/v1/documents/{doc.pk}/").status_code == 200


@pytest.mark.django_db
def test_a_new_chat_does_not_query_the_rows_it_was_given(world):
    """The agent, its tenant and the user are in hand: ``full_clean`` does not look them up
    again (it did, one query each, on every chat a door's request makes)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"])
    with tenant_scope(world.tenant.pk), CaptureQueriesContext(connection) as queries:
        chat_session_create(user=world.member, agent=agent)
    looked_up = [q["sql"] for q in queries.captured_queries
                 if q["sql"].startswith("SELECT") and any(t in q["sql"] for t in (
                     '"tenants_tenant"', '"agents_agentinstance"', '"auth_user"'))]
    assert looked_up == []
