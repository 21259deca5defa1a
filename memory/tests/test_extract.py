"""Extraction and merging against the scripted model server (``fake_llm``) and the real embedded
embedder (``embedding_server``, all-MiniLM-L6-v2): add, confirm a near duplicate, reword
(UPDATE), replace a contradiction (DELETE), nothing twice on re-extraction, malformed answers
retried later, and only the user's own memories shown to the model."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from agents.tests.factories import agent_with_route
from llm.embeddings import DEFAULT_EMBEDDING_MODEL, EmbeddingEndpoint, embed_texts
from llm.testing import Reply
from memory import services
from memory.extraction import DECIDE_PROMPT, EXTRACT_PROMPT
from memory.models import Memory, MemoryExtraction
from memory.services import ExtractionBusy, MemoryOff, memory_extract_session
from memory.tests.factories import memory_binding
from sessions.models import ChatSession, Message, Run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def embedder(settings, embedding_server):
    """Tenants' default embedding provider is the test's embedding server."""
    settings.EMBEDDINGS_BASE_URL = embedding_server
    return EmbeddingEndpoint(name="test", base_url=embedding_server)


@pytest.fixture
def agent(world, fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    memory_binding(agent)
    return agent


def _chat(world, agent, *turns: tuple[str, str], session=None) -> ChatSession:
    """A session of the world's member with ``turns`` [(user text, assistant text)] appended."""
    session = session or ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    position = Message.all_tenants.filter(session=session).count()
    for user_text, reply in turns:
        run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input=user_text,
                                     status="completed", reply=reply)
        for role, text in (("user", user_text), ("assistant", reply)):
            Message.all_tenants.create(tenant=world.tenant, session=session, run=run, position=position, role=role,
                                       content=text)
            position += 1
    return session


def _extract(world, session, **kwargs):
    with tenant_scope(world.tenant.pk):
        return memory_extract_session(session_id=session.pk, **kwargs)


def _answer(*memories: tuple[str, str]) -> Reply:
    return Reply(json.dumps({"memories": [{"text": t, "category": c} for t, c in memories]}))


def _decision(event: str, id_: str | None = None, text: str | None = None) -> Reply:
    return Reply(json.dumps({"event": event, "id": id_, "text": text}))


def _texts(world, agent) -> set[str]:
    return set(Memory.all_tenants.filter(user=world.member, agent=agent).values_list("text", flat=True))


def test_facts_are_extracted_embedded_and_stored(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("Hi, I'm Ana, a nurse in Lyon. Please always answer in French.", "Bonjour Ana !"),
                    ("What's the weather like?", "I cannot check the weather."))
    fake_llm.script(_answer(("Is a nurse in Lyon.", "fact"), ("Prefers answers in French.", "preference")))
    outcome = _extract(world, session)
    assert (outcome.added, outcome.updated, outcome.replaced, outcome.confirmed, outcome.error) == (2, 0, 0, 0, "")

    [request] = fake_llm.requests
    assert request["messages"][0] == {"role": "system", "content": EXTRACT_PROMPT}
    assert request["messages"][1]["content"] == (
        "USER: Hi, I'm Ana, a nurse in Lyon. Please always answer in French.\nASSISTANT: Bonjour Ana !\n"
        "USER: What's the weather like?\nASSISTANT: I cannot check the weather."
    )
    rows = {m.text: m for m in Memory.all_tenants.filter(user=world.member, agent=agent)}
    assert set(rows) == {"Is a nurse in Lyon.", "Prefers answers in French."}
    french = rows["Prefers answers in French."]
    assert (french.category, french.dimensions, french.embedding_model, french.source_session_id) == (
        "preference", 384, DEFAULT_EMBEDDING_MODEL, session.pk)
    [expected] = embed_texts(embedder, DEFAULT_EMBEDDING_MODEL, ["Prefers answers in French."])
    assert sum(a * b for a, b in zip(french.embedding, expected, strict=True)) > 0.999
    state = MemoryExtraction.all_tenants.get(session=session)
    assert state.last_message_id == Message.all_tenants.filter(session=session).order_by("-id").first().pk
    assert state.lease_until is None and state.failures == 0


def test_re_extraction_reads_only_new_messages_and_confirms_what_is_known(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I'm vegetarian, and please answer in French.", "D'accord."))
    fake_llm.script(_answer(("Is vegetarian.", "fact"), ("Prefers answers in French.", "preference")))
    _extract(world, session)
    before = {m.text: m.updated_at for m in Memory.all_tenants.all()}

    # nothing new: no model call at all
    assert _extract(world, session).batches == 0
    assert len(fake_llm.requests) == 1

    # new messages repeat a known fact (other punctuation) and add one
    _chat(world, agent, ("Remember: answers in French please! Also I have two cats.", "Noted."), session=session)
    fake_llm.script(_answer(("prefers answers in French", "preference"), ("Has two cats.", "fact")))
    outcome = _extract(world, session)
    assert (outcome.added, outcome.confirmed, outcome.updated, outcome.replaced) == (1, 1, 0, 0)
    assert len(fake_llm.requests) == 2  # the known fact needed no decision
    assert "Is vegetarian" not in fake_llm.requests[1]["messages"][1]["content"]  # only the new messages
    assert _texts(world, agent) == {"Is vegetarian.", "Prefers answers in French.", "Has two cats."}
    french = Memory.all_tenants.get(text="Prefers answers in French.")
    assert french.updated_at > before["Prefers answers in French."]
    assert Memory.all_tenants.get(text="Is vegetarian.").updated_at == before["Is vegetarian."]


def test_a_refinement_is_merged_into_the_existing_memory(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("Please answer in French.", "D'accord."))
    fake_llm.script(_answer(("Prefers answers in French.", "preference")))
    _extract(world, session)
    original = Memory.all_tenants.get()

    _chat(world, agent, ("And keep your answers short, in French.", "Compris."), session=session)
    fake_llm.script(_answer(("Prefers short answers in French.", "preference")),
                    _decision("UPDATE", "1", "Prefers short answers, in French."))
    outcome = _extract(world, session)
    assert (outcome.updated, outcome.added, outcome.replaced) == (1, 0, 0)

    decide = fake_llm.requests[-1]["messages"]
    assert decide[0]["content"] == DECIDE_PROMPT
    assert json.loads(decide[1]["content"]) == {
        "existing_memories": [{"id": "1", "text": "Prefers answers in French."}],
        "candidate": {"text": "Prefers short answers in French.", "category": "preference"},
    }
    updated = Memory.all_tenants.get()
    assert updated.pk == original.pk
    assert (updated.text, updated.replaced_text) == ("Prefers short answers, in French.", "Prefers answers in French.")
    [expected] = embed_texts(embedder, DEFAULT_EMBEDDING_MODEL, ["Prefers short answers, in French."])
    assert sum(a * b for a, b in zip(updated.embedding, expected, strict=True)) > 0.999  # re-embedded


def test_a_contradiction_replaces_the_memory(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I live in Lyon.", "Nice city."))
    fake_llm.script(_answer(("Lives in Lyon.", "fact")))
    _extract(world, session)
    lyon = Memory.all_tenants.get()

    _chat(world, agent, ("I moved to Berlin last month.", "Welcome to Berlin!"), session=session)
    fake_llm.script(_answer(("Moved to Berlin.", "fact")), _decision("DELETE", "1"))
    outcome = _extract(world, session)
    assert (outcome.replaced, outcome.added, outcome.updated) == (1, 0, 0)
    berlin = Memory.all_tenants.get()
    assert berlin.pk != lyon.pk
    assert (berlin.text, berlin.replaced_text) == ("Moved to Berlin.", "Lives in Lyon.")


def test_unrelated_facts_are_added_without_asking(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I live in Lyon.", "Nice."))
    fake_llm.script(_answer(("Lives in Lyon.", "fact")))
    _extract(world, session)
    _chat(world, agent, ("I have two cats.", "Lovely."), session=session)
    fake_llm.script(_answer(("Has two cats.", "fact")))
    assert _extract(world, session).added == 1
    assert len(fake_llm.requests) == 2  # no merge decision
    assert _texts(world, agent) == {"Lives in Lyon.", "Has two cats."}


def test_a_none_decision_confirms_and_adds_nothing(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I'm vegetarian.", "OK."))
    fake_llm.script(_answer(("Is vegetarian.", "fact")))
    _extract(world, session)
    _chat(world, agent, ("As I said, no meat for me.", "Understood."), session=session)
    fake_llm.script(_answer(("Does not eat meat.", "fact")), _decision("NONE", "1"))
    outcome = _extract(world, session)
    assert (outcome.confirmed, outcome.added) == (1, 0)
    assert _texts(world, agent) == {"Is vegetarian."}


def test_the_model_sees_only_this_users_memories_with_this_agent(world, agent, fake_llm, embedder):
    colleague = get_user_model().objects.create_user(username="colleague", password="pw-colleague-123")
    other = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=colleague)
    run = Run.all_tenants.create(tenant=world.tenant, session=other, user=colleague, input="x", status="completed")
    Message.all_tenants.create(tenant=world.tenant, session=other, run=run, position=0, role="user",
                               content="I live in Paris.")
    fake_llm.script(_answer(("Lives in Paris.", "fact")))
    with tenant_scope(world.tenant.pk):
        memory_extract_session(session_id=other.pk)

    session = _chat(world, agent, ("I live in Lyon.", "Nice."))
    fake_llm.script(_answer(("Lives in Lyon.", "fact")))
    assert _extract(world, session).added == 1  # the colleague's "Lives in Paris." is not related to this user
    assert len(fake_llm.requests) == 2
    assert _texts(world, agent) == {"Lives in Lyon."}


def test_a_malformed_answer_is_retried_later_and_never_crashes(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I'm Ana.", "Hi Ana."))
    fake_llm.script(Reply("Sure! Ana is the user's name."))
    outcome = _extract(world, session)
    assert outcome.error.startswith("malformed answer: not JSON") and outcome.added == 0
    state = MemoryExtraction.all_tenants.get(session=session)
    assert (state.last_message_id, state.failures, state.lease_until) == (0, 1, None)
    assert state.retry_after > timezone.now()
    assert "not JSON" in state.last_error

    with pytest.raises(ExtractionBusy):  # the beat waits for retry_after
        _extract(world, session)
    fake_llm.script(_answer(("Name is Ana.", "fact")))
    assert _extract(world, session, force=True).added == 1  # on demand does not wait
    state.refresh_from_db()
    assert (state.failures, state.retry_after, state.last_error) == (0, None, "")


def test_a_batch_malformed_too_often_is_skipped(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I'm Ana.", "Hi Ana."))
    for attempt in range(1, services.MAX_MALFORMED_ATTEMPTS + 1):
        fake_llm.script(Reply('{"memories": "Ana"}'))
        outcome = _extract(world, session, force=True)
        assert "unexpected shape" in outcome.error
        state = MemoryExtraction.all_tenants.get(session=session)
        if attempt < services.MAX_MALFORMED_ATTEMPTS:
            assert (state.failures, state.last_message_id) == (attempt, 0)
    assert state.last_message_id == Message.all_tenants.filter(session=session).order_by("-id").first().pk
    assert state.failures == 0 and Memory.all_tenants.count() == 0


def test_a_malformed_decision_leaves_the_batch_for_later(world, agent, fake_llm, embedder):
    session = _chat(world, agent, ("I live in Lyon.", "Nice."))
    fake_llm.script(_answer(("Lives in Lyon.", "fact")))
    _extract(world, session)
    watermark = MemoryExtraction.all_tenants.get(session=session).last_message_id
    _chat(world, agent, ("I moved to Berlin.", "Welcome!"), session=session)
    fake_llm.script(_answer(("Moved to Berlin.", "fact")), _decision("DELETE", "9"))  # an id it was not shown
    outcome = _extract(world, session)
    assert "not one of ['1']" in outcome.error
    assert MemoryExtraction.all_tenants.get(session=session).last_message_id == watermark
    assert _texts(world, agent) == {"Lives in Lyon."}


def test_a_failing_model_route_is_retried_later(world, agent, fake_llm, embedder):
    from llm.testing import Fail

    session = _chat(world, agent, ("I'm Ana.", "Hi."))
    fake_llm.script(Fail(503), Fail(503), Fail(503))
    outcome = _extract(world, session)
    assert outcome.error and outcome.added == 0
    state = MemoryExtraction.all_tenants.get(session=session)
    assert state.failures == 1 and state.last_message_id == 0 and state.retry_after is not None


def test_memory_off_and_tool_only_batches(world, fake_llm, embedder):
    off = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    with pytest.raises(MemoryOff):
        _extract(world, _chat(world, off, ("I'm Ana.", "Hi.")))
    on = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    memory_binding(on)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=on, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="", status="completed")
    Message.all_tenants.create(tenant=world.tenant, session=session, run=run, position=0, role="assistant",
                               content="Hello! How can I help?")
    outcome = _extract(world, session)  # nothing the user said: the watermark moves, no model call
    assert outcome.batches == 1 and fake_llm.requests == []


def test_extract_session_task(world, agent, fake_llm, embedder):
    from memory.tasks import memory_extract_session as task

    session = _chat(world, agent, ("I'm Ana.", "Hi."))
    fake_llm.script(_answer(("Name is Ana.", "fact")))
    assert task(session.pk, world.tenant.pk)["added"] == 1
    assert task(999999, world.tenant.pk) == {"status": "missing"}
    other = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    assert task(_chat(world, other, ("x", "y")).pk, world.tenant.pk) == {"status": "off"}
