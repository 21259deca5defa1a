"""Chat titles from the first exchange (issue 25): the run's end hands a chat's first answer to
the title task; the task asks the agent's route (the fake model server) for a short title and
sets it unless the user renamed the chat; a failure keeps the title made from the first message."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from channels.db import database_sync_to_async

from agents.tests.factories import agent_with_route
from llm.testing import Fail, Reply
from sessions import tasks
from sessions.chat_services import TITLE_MAX_OUTPUT_TOKENS, chat_session_rename, chat_title_clean
from sessions.events import events_since_sync
from sessions.models import ChatSession, LLMCall
from sessions.runner.loop import execute_run
from sessions.services import chat_session_create, message_post
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

QUESTION = "Please plan a **trip** to Kyoto in May, with temples and food"
ANSWER = "Here is a five-day plan for Kyoto in May: day one, Fushimi Inari; day two, Nishiki market…"


@pytest.fixture
def titles_sent(monkeypatch, settings):
    """Title tasks the runs send (recorded, not run). The test settings switch titles off
    (CHAT_TITLES_FROM_MODEL: a worker's title request would be one more request to the fake
    model servers of other tests); these tests switch them on."""
    settings.CHAT_TITLES_FROM_MODEL = True
    sent = []
    monkeypatch.setattr(tasks, "chat_title_enqueue", lambda **kw: sent.append(kw))
    return sent


@database_sync_to_async
def new_chat(world, url, content=QUESTION):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=world.member, agent=agent)
        return session, message_post(session=session, user=world.member, content=content)


@database_sync_to_async
def post(session, user, content):
    with tenant_scope(session.tenant_id):
        return message_post(session=session, user=user, content=content)


@database_sync_to_async
def title_task(session, run):
    """The Celery task, run as a worker runs it (called directly)."""
    return tasks.chat_session_title_generate(session_id=session.pk, run_id=run.pk, tenant_id=session.tenant_id)


@database_sync_to_async
def title_of(session) -> str:
    return ChatSession.all_tenants.get(pk=session.pk).title


def titled_events(session) -> list[dict]:
    return [e for e in events_since_sync(session_id=session.pk, after_seq=0) if e["type"] == "session_titled"]


async def test_no_title_task_when_titles_are_off(world, fake_llm, titles_sent, settings):
    settings.CHAT_TITLES_FROM_MODEL = False
    fake_llm.script(Reply(ANSWER))
    _session, run = await new_chat(world, fake_llm.base_url)
    await execute_run(run.pk)
    assert titles_sent == []


async def test_the_first_answer_gets_a_title_from_the_model(world, fake_llm, titles_sent):
    fake_llm.script(Reply(ANSWER), Reply('Title: "Kyoto Trip in May."'), Reply("Second answer."))
    session, run = await new_chat(world, fake_llm.base_url)
    assert await title_of(session) == "Please plan a trip to Kyoto in May, with temples and food"
    await execute_run(run.pk)
    assert titles_sent == [{"session_id": session.pk, "run_id": run.pk, "tenant_id": world.tenant.pk}]

    assert await title_task(session, run) == "Kyoto Trip in May"
    assert await title_of(session) == "Kyoto Trip in May"
    request = fake_llm.requests[1]
    assert request["max_tokens"] == TITLE_MAX_OUTPUT_TOKENS and "tools" not in request
    assert QUESTION in request["messages"][1]["content"] and ANSWER in request["messages"][1]["content"]
    events = await database_sync_to_async(titled_events)(session)
    assert [(e["run_id"], e["data"]) for e in events] == [(run.pk, {"title": "Kyoto Trip in May"})]
    # the title's model call is not one of the run's (its trace stays the run's own turns)
    calls = await database_sync_to_async(lambda: LLMCall.all_tenants.filter(run_id=run.pk).count())()
    assert calls == 1

    # the next exchange of the chat sends no title task
    second = await post(session, world.member, "And in June?")
    await execute_run(second.pk)
    assert len(titles_sent) == 1 and len(fake_llm.requests) == 3


async def test_a_failed_title_request_keeps_the_title_from_the_first_message(world, fake_llm, titles_sent):
    fake_llm.script(Reply(ANSWER), Fail(500))
    session, run = await new_chat(world, fake_llm.base_url)
    await execute_run(run.pk)
    assert await title_task(session, run) == ""
    assert await title_of(session) == "Please plan a trip to Kyoto in May, with temples and food"
    assert await database_sync_to_async(titled_events)(session) == []
    assert len(fake_llm.requests) == 2  # asked once (no retries), then left alone


async def test_an_answer_that_is_no_title_keeps_the_title(world, fake_llm, titles_sent):
    fake_llm.script(Reply(ANSWER), Reply("Sure! Here is a title that sums up the whole conversation for you nicely now"))
    session, run = await new_chat(world, fake_llm.base_url)
    await execute_run(run.pk)
    assert await title_task(session, run) == ""
    assert await title_of(session) == "Please plan a trip to Kyoto in May, with temples and food"


async def test_a_renamed_chat_is_never_titled_by_the_model(world, fake_llm, titles_sent):
    fake_llm.script(Reply(ANSWER))
    session, run = await new_chat(world, fake_llm.base_url)
    await execute_run(run.pk)

    @database_sync_to_async
    def rename():
        with tenant_scope(world.tenant.pk):
            chat_session_rename(session=session, title="My Kyoto notes")

    await rename()
    assert await title_task(session, run) == ""
    assert len(fake_llm.requests) == 1  # not even asked
    assert await title_of(session) == "My Kyoto notes"


async def test_a_rename_while_the_model_answers_wins(world, fake_llm, titles_sent):
    fake_llm.script(Reply(ANSWER))
    session, run = await new_chat(world, fake_llm.base_url)
    await execute_run(run.pk)

    def rename() -> int:
        with tenant_scope(world.tenant.pk):
            return ChatSession.objects.filter(pk=session.pk).update(title="Renamed meanwhile")

    def rename_then_answer(body):  # in the server's event loop: the ORM call goes to a thread
        with ThreadPoolExecutor(1) as pool:
            renamed.append(pool.submit(rename).result())
        return Reply("Kyoto Trip")

    renamed: list[int] = []
    fake_llm.respond(rename_then_answer)
    assert await title_task(session, run) == ""
    assert renamed == [1] and len(fake_llm.requests) == 2
    assert await title_of(session) == "Renamed meanwhile"
    assert await database_sync_to_async(titled_events)(session) == []


async def test_other_sessions_runs_and_deleted_chats_are_left_alone(world, fake_llm, titles_sent):
    fake_llm.script(Reply(ANSWER), Reply(ANSWER))
    session, run = await new_chat(world, fake_llm.base_url)
    await execute_run(run.pk)
    other, other_run = await new_chat(world, fake_llm.base_url, content="Something else entirely")
    await execute_run(other_run.pk)
    assert await title_task(session, other_run) == ""  # a run of another chat
    await database_sync_to_async(
        lambda: ChatSession.all_tenants.filter(pk=session.pk).update(deleted_at="2026-01-01T00:00:00Z"))()
    assert await title_task(session, run) == ""
    assert len(fake_llm.requests) == 2


def test_chat_title_clean() -> None:
    assert chat_title_clean('Title: "Trip to Kyoto."') == "Trip to Kyoto"
    assert chat_title_clean("**Kyoto in May**\n\nMore text") == "Kyoto in May"
    assert chat_title_clean("  « Budget   Q3 »  ") == "Budget Q3"
    assert chat_title_clean("") == chat_title_clean("\n  \n") == chat_title_clean('""') == ""
    assert chat_title_clean(" ".join(["word"] * 13)) == ""
