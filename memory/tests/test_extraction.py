"""The model's answers as memory reads them (no database, no model)."""

from __future__ import annotations

import pytest

from memory.extraction import (
    MAX_CANDIDATES,
    MalformedAnswer,
    TranscriptLine,
    parse_decision,
    parse_extraction,
    recall_text,
    transcript,
)
from memory.policy import MemoryPolicy, policy_errors

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def test_extraction_answer_is_read_in_order_without_repeats():
    answer = ('{"memories": [{"text": "Prefers  answers in French.", "category": "preference"},'
              ' {"text": "Works as a nurse in Lyon.", "category": "fact"},'
              ' {"text": "prefers answers in french.", "category": "preference"}]}')
    got = parse_extraction(answer)
    assert [(c.text, c.category) for c in got] == [("Prefers answers in French.", "preference"),
                                                   ("Works as a nurse in Lyon.", "fact")]


def test_extraction_answer_in_a_code_fence_is_accepted():
    assert [c.text for c in parse_extraction('```json\n{"memories": [{"text": "Is vegan."}]}\n```')] == ["Is vegan."]


def test_empty_extraction_is_no_candidates():
    assert parse_extraction('{"memories": []}') == []


def test_extraction_keeps_at_most_the_cap():
    items = ",".join(f'{{"text": "Fact number {i}."}}' for i in range(MAX_CANDIDATES + 5))
    assert len(parse_extraction(f'{{"memories": [{items}]}}')) == MAX_CANDIDATES


@pytest.mark.parametrize("answer", [
    "Sure! The user likes tea.",                                   # prose
    '["Likes tea."]',                                              # not an object
    '{"facts": ["Likes tea."]}',                                   # wrong key
    '{"memories": ["Likes tea."]}',                                # items not objects
    '{"memories": [{"text": "Likes tea.", "category": "hobby"}]}',  # unknown category
    '{"memories": [{"text": 42}]}',                                # text not a string
    '{"memories": [{"text": "' + "x" * 400 + '"}]}',               # longer than a sentence
    '{"memories": [{"text": "Likes tea."}',                        # cut off
])
def test_malformed_extraction_answers_raise(answer):
    with pytest.raises(MalformedAnswer):
        parse_extraction(answer)


def test_decision_answers():
    assert parse_decision('{"event": "ADD", "id": null, "text": null}', shown_ids=["1"]).event == "ADD"
    update = parse_decision('{"event": "update", "id": 2, "text": "Lives in Berlin since 2024."}', shown_ids=["1", "2"])
    assert (update.event, update.id, update.text) == ("UPDATE", "2", "Lives in Berlin since 2024.")
    assert parse_decision('{"event": "DELETE", "id": "1"}', shown_ids=["1"]).id == "1"
    assert parse_decision('{"event": "NONE", "id": "1"}', shown_ids=["1"]).event == "NONE"


@pytest.mark.parametrize("answer", [
    '{"event": "DELETE", "id": "7"}',          # an id it was not shown
    '{"event": "UPDATE", "id": "1"}',          # no merged text
    '{"event": "MERGE", "id": "1"}',           # unknown event
    "UPDATE 1",                                # not JSON
])
def test_malformed_decisions_raise(answer):
    with pytest.raises(MalformedAnswer):
        parse_decision(answer, shown_ids=["1", "2"])


def test_transcript_and_recall_text():
    long = "y" * 3000
    text = transcript([TranscriptLine("user", "I am Ana."), TranscriptLine("assistant", long)])
    assert text.startswith("USER: I am Ana.\nASSISTANT: yyy") and text.endswith(" […]")
    assert recall_text(["Name is Ana.", "Prefers short answers."]) == (
        "What you know about this user (from earlier conversations; it may be out of date):\n"
        "- Name is Ana.\n- Prefers short answers."
    )


def test_policy_defaults_and_errors():
    assert MemoryPolicy.from_config({}) == MemoryPolicy(retention_days=365, max_items=5, extract_after_idle_minutes=30)
    assert MemoryPolicy.from_config({"max_items": 3}).max_items == 3
    assert policy_errors({"retention_days": 30, "max_items": 5, "extract_after_idle_minutes": 10}) == {}
    assert set(policy_errors({"max_items": 0, "retention_days": "a year", "colour": 1})) == {
        "max_items", "retention_days", "config"}
    assert policy_errors({"max_items": True}) == {"max_items": "An integer from 1 to 20."}
    assert policy_errors([]) == {"config": "A JSON object."}
