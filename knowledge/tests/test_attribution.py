"""Platform attribution (knowledge.attribution): an answer that cites none of the passages it was
given gets its sentences matched to them when the run completes, stored on the run, sent with
``run_completed`` and in the REST session detail; an answer that cites gets none; a failing or
slow embedder never fails the run.

Real PostgreSQL, the real embedded embedder (all-MiniLM-L6-v2, the model the threshold was
calibrated with) or the fake one where it must fail, and the scripted model server.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from knowledge.attribution import ATTRIBUTION_THRESHOLD, answer_sentences, best_passages, cites_any, passage_numbers
from knowledge.tests.fake_embedder import running
from knowledge.tests.test_kind import SAILING, _agent, _calls, _events, _kb, run_now
from llm.testing import Reply, ToolCalls
from sessions.models import Run
from sessions.tests.conftest import post_message_sync

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

HOURS = "The boathouse opens at eight in the morning and closes at sunset from April until October."
OFF_TOPIC = "My favourite pizza has mushrooms, olives and a lot of extra cheese on top."


# --- pure parts -----------------------------------------------------------------------------------


def test_sentences_carry_their_offsets_and_skip_code_markers_and_short_fragments() -> None:
    reply = ("Yes.\n\nThe club owns four dinghies in total. They are kept in the blue boathouse!\n\n"
             "- First item of a list is here.\n2. A numbered item is here too.\n"
             "```python\nprint('code is never attributed, even long code.')\n```\n"
             "See e.g. the handbook for the details? Ok.")
    sentences = answer_sentences(reply)
    assert [s.text for s in sentences] == [
        "The club owns four dinghies in total.", "They are kept in the blue boathouse!",
        "First item of a list is here.", "A numbered item is here too.", "See e.g. the handbook for the details?",
    ]
    assert all(reply[s.start:s.end] == s.text for s in sentences)


def test_cites_any_counts_only_the_run_s_numbers() -> None:
    assert cites_any("It opens at 8 [2].", [1, 2])
    assert not cites_any("It opens at 8 [7].", [1, 2])
    assert not cites_any("It opens at 8.", [1, 2])
    assert passage_numbers([{"n": 1, "chunk_id": 5}, {"n": 3, "chunk_id": 5}, {"n": "x"}, None]) == {5: 1}


def test_best_passages_keeps_the_nearest_at_or_above_the_threshold() -> None:
    passages = [(10, [1.0, 0.0]), (11, [0.0, 1.0])]
    matches = best_passages([[0.8, 0.6], [0.6, 0.8], [0.5, 0.5]], passages, threshold=0.7)
    assert matches == [(10, pytest.approx(0.8)), (11, pytest.approx(0.8)), None]


# --- a run ----------------------------------------------------------------------------------------

real_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def _searching_run(world, fake_llm, url, answer: str) -> Run:
    kb = _kb(world.tenant, url, "Club", SAILING)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 2, "search_first": True})
    fake_llm.script(ToolCalls([("knowledge_search", {"query": "boathouse opening hours"})]), Reply(answer))
    run = post_message_sync(agent=agent, user=world.member, content="When does the boathouse open?")
    run_now(run.pk)
    return Run.all_tenants.get(pk=run.pk)


def _n_of(run: Run, needle: str) -> int:
    """The run's citation number of the passage whose text holds ``needle``."""
    from knowledge.models import Chunk

    [call] = _calls(run.pk)
    for c in call.result_data["citations"]:
        if needle in Chunk.all_tenants.get(pk=c["chunk_id"]).text:
            return c["n"]
    raise AssertionError(f"no passage holds {needle!r}")


@real_db
def test_an_uncited_answer_is_attributed_to_the_right_passage_and_an_unrelated_sentence_is_not(
        world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    answer = f"{HOURS} {OFF_TOPIC}"
    run = _searching_run(world, fake_llm, embedding_server, answer)

    assert run.status == "completed", run.error
    assert run.reply == answer  # the model's text is never changed
    [attribution] = run.attributions
    assert answer[attribution["sentence_start"]:attribution["sentence_end"]] == HOURS
    assert attribution["n"] == _n_of(run, "opens at 8")
    assert attribution["score"] >= ATTRIBUTION_THRESHOLD
    [completed] = _events(run.pk, "run_completed")
    assert completed["data"] == {"reply": answer, "attributions": run.attributions}

    resp = world.client().get(f"/api/v1/sessions/{run.session_id}/")
    assert resp.status_code == 200, resp.content
    [listed] = [r for r in resp.json()["runs"] if r["id"] == run.pk]
    assert listed["attributions"] == run.attributions


def test_code_spans_are_the_quotes_long_enough_to_say_where_they_came_from() -> None:
    from knowledge.attribution import code_spans

    assert code_spans("Run `make run`, then `make test` (not `-v`, nor `...`).") == ["make run", "make test"]
    assert code_spans("No code here, only `unclosed quotes.") == []


@real_db
def test_a_sentence_quoting_a_passage_in_code_goes_to_that_passage(
        world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    """A sentence far from the passage in meaning (its cosine below the threshold) that quotes
    the passage's text verbatim in inline code is attributed to it."""
    quoting = "My pizza order at the cheese counter, with olives, is filed under `four dinghies` today."
    run = _searching_run(world, fake_llm, embedding_server, f"{quoting} {OFF_TOPIC}")
    [attribution] = run.attributions
    assert (run.reply[attribution["sentence_start"]:attribution["sentence_end"]], attribution["n"]) == (
        quoting, _n_of(run, "four dinghies"))
    assert attribution["score"] < ATTRIBUTION_THRESHOLD, "the quote, not the meaning, placed it"


@real_db
def test_an_answer_that_cites_gets_no_attribution(world, fake_llm, embedding_server, no_enqueue, no_ingest_task):
    run = _searching_run(world, fake_llm, embedding_server, f"{HOURS[:-1]} [1].")

    assert run.status == "completed", run.error
    assert run.attributions is None
    [completed] = _events(run.pk, "run_completed")
    assert "attributions" not in completed["data"]


@real_db
def test_a_failing_embedder_leaves_the_run_completed_without_attribution(world, fake_llm, no_enqueue, no_ingest_task):
    with running() as embedder:
        kb = _kb(world.tenant, embedder.base_url, "Club", SAILING)
        agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk], "top_k": 2, "search_first": True})
        fake_llm.script(ToolCalls([("knowledge_search", {"query": "boathouse opening hours"})]), Reply(HOURS))
        embedder.fail_after = len(embedder.requests) + 1  # the search's query embeds; the attribution's fails
        run = post_message_sync(agent=agent, user=world.member, content="When does the boathouse open?")
        run_now(run.pk)
        requests = len(embedder.requests)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    assert [c.status for c in _calls(run.pk)] == ["succeeded"]
    assert requests == embedder.fail_after + 1  # the attribution asked, and was refused
    assert run.attributions is None
    [completed] = _events(run.pk, "run_completed")
    assert completed["data"] == {"reply": HOURS}


@real_db
def test_a_slow_attribution_is_given_up_after_the_time_limit(world, fake_llm, embedding_server, no_enqueue,
                                                           no_ingest_task, monkeypatch):
    entered: list[float] = []

    async def stuck(*args, **kwargs):
        entered.append(time.time())
        await asyncio.sleep(30)

    monkeypatch.setattr("knowledge.attribution.attribute", stuck)
    monkeypatch.setattr("sessions.runner.run_context.ATTRIBUTION_TIMEOUT_SECONDS", 0.3)
    run = _searching_run(world, fake_llm, embedding_server, HOURS)

    assert run.status == "completed", run.error
    assert run.attributions is None
    [started] = entered
    assert run.finished_at.timestamp() - started < 3  # given up after 0.3 s, not the 30 s it would take
