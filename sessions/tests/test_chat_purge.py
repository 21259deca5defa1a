"""Deleted chats are purged after the retention period (issue 25): the beat task hard-deletes
them with their runs, messages, artifacts and documents, in every tenant (their LLM calls stay,
without a run: test_llm_call_purposes.py); chats deleted more recently, restored ones and live
ones stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from agent_platform.redis_clients import sync_redis
from agents.tests.factories import agent_with_route
from documents.models import Document
from sessions import tasks
from sessions.events import event_publish_sync, session_keys
from sessions.models import Artifact, ChatSession, LLMCall, Message, Run, RunStatus, ToolCall
from sessions.services import artifact_create, chat_session_create, message_post
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


def _chat(world, *, deleted_days_ago: float | None, status=RunStatus.COMPLETED):
    """A chat with a run, its messages, a tool call, an LLM call, an artifact, a document and
    an event in Redis; deleted ``deleted_days_ago`` days ago (None: not deleted)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=world.member, agent=agent)
        run = message_post(session=session, user=world.member, content="hello")
        Run.objects.filter(pk=run.pk).update(status=status)
        ToolCall.objects.create(tenant_id=session.tenant_id, run=run, turn=0, call_id="c1", name="t")
        LLMCall.objects.create(tenant_id=session.tenant_id, run=run, turn=0, attempt=1, entry_index=0,
                               provider_name="p", model="m", status="succeeded", cost_usd_micros=5)
        artifact_create(tenant_id=session.tenant_id, session_id=session.pk, name="a.png", mime_type="image/png",
                        data=b"\x89PNG" * 10, run_id=run.pk)
        Document.objects.create(tenant_id=session.tenant_id, session=session, title="Notes", content="x")
        if deleted_days_ago is not None:
            ChatSession.objects.filter(pk=session.pk).update(
                deleted_at=timezone.now() - timedelta(days=deleted_days_ago))
    event_publish_sync(session_id=session.pk, run_id=run.pk, type="run_completed", data={"reply": "hi"})
    return session


def _left(session) -> dict[str, int]:
    return {
        "session": ChatSession.all_tenants.filter(pk=session.pk).count(),
        "runs": Run.all_tenants.filter(session_id=session.pk).count(),
        "messages": Message.all_tenants.filter(session_id=session.pk).count(),
        "tool_calls": ToolCall.all_tenants.filter(run__session_id=session.pk).count(),
        "llm_calls": LLMCall.all_tenants.filter(run__session_id=session.pk).count(),  # of its runs (kept, run NULL)
        "artifacts": Artifact.all_tenants.filter(session_id=session.pk).count(),
        "documents": Document.all_tenants.filter(session_id=session.pk).count(),
        "redis_keys": sync_redis().exists(*session_keys(session.pk)),
    }


GONE = {"session": 0, "runs": 0, "messages": 0, "tool_calls": 0, "llm_calls": 0, "artifacts": 0, "documents": 0,
        "redis_keys": 0}
KEPT = {"session": 1, "runs": 1, "messages": 1, "tool_calls": 1, "llm_calls": 1, "artifacts": 1, "documents": 1,
        "redis_keys": 2}


def test_chats_deleted_longer_ago_than_the_retention_are_purged_in_every_tenant(world, other_world):
    old = _chat(world, deleted_days_ago=31)
    other_tenants_old = _chat(other_world, deleted_days_ago=45)
    recent = _chat(world, deleted_days_ago=29)
    live = _chat(world, deleted_days_ago=None)
    still_running = _chat(world, deleted_days_ago=40, status=RunStatus.RUNNING)

    assert tasks.chat_sessions_purge() == 2  # the Celery task, called as a worker calls it

    assert _left(old) == GONE and _left(other_tenants_old) == GONE
    assert _left(recent) == KEPT and _left(live) == KEPT and _left(still_running) == KEPT
    assert tasks.chat_sessions_purge() == 0  # nothing left to do


def test_the_retention_is_a_setting_and_zero_keeps_deleted_chats(world):
    chat = _chat(world, deleted_days_ago=3)
    with override_settings(CHAT_PURGE_AFTER_DAYS=0):
        assert tasks.chat_sessions_purge() == 0
    with override_settings(CHAT_PURGE_AFTER_DAYS=7):
        assert tasks.chat_sessions_purge() == 0
    assert _left(chat) == KEPT
    with override_settings(CHAT_PURGE_AFTER_DAYS=2):
        assert tasks.chat_sessions_purge() == 1
    assert _left(chat) == GONE


def test_the_purge_is_scheduled_by_celery_beat():
    from django.conf import settings

    assert any(entry["task"] == "sessions.chat_sessions_purge" for entry in settings.CELERY_BEAT_SCHEDULE.values())
