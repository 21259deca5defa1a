"""The guardrail kinds on text (guardrails.checks, guardrails.pii): no database, no run."""

from __future__ import annotations

import pytest

from guardrails.checks import GuardrailSpec, check, check_text, config_problem, model_check_messages, user_message
from guardrails.pii import pii_find, pii_mask


def _spec(kind: str, config: dict, **extra) -> GuardrailSpec:
    return GuardrailSpec(name="g", point="output", kind=kind, config=config, **extra)


def test_deny_list_matches_whole_words_case_insensitively():
    spec = _spec("deny_list", {"words": ["project falcon", "secret"]})
    assert check_text(spec, "Tell me about Project FALCON.").tripped
    assert check_text(spec, "A SECRET!").tripped
    assert not check_text(spec, "secretary and falconry are fine").tripped


def test_regex_blocks_or_masks():
    spec = _spec("regex", {"pattern": r"ACME-\d{4}"})
    assert check_text(spec, "ticket ACME-1234").tripped
    masked = check_text(_spec("regex", {"pattern": r"ACME-\d{4}"}, action="mask"), "ACME-1234 and ACME-9999")
    assert (masked.tripped, masked.masked, masked.masks) == (False, "[REDACTED] and [REDACTED]", 2)


def test_pii_finds_valid_ibans_and_cards_only():
    text = ("mail jane.doe@example.com, call +49 30 1234567, IBAN DE89 3704 0044 0532 0130 00, "
            "card 4111 1111 1111 1111; not: DE89 3704 0044 0532 0130 01, 4111 1111 1111 1112, order 1234567890")
    found = pii_find(text)
    assert [m.type for m in found] == ["email", "phone", "iban", "card"]
    assert pii_mask(text, found) == ("mail [EMAIL], call [PHONE], IBAN [IBAN], card [CARD]; not: "
                                     "DE89 3704 0044 0532 0130 01, 4111 1111 1111 1112, order 1234567890")
    assert [m.type for m in pii_find(text, ["card"])] == ["card"]


def test_pii_block_names_the_types_not_the_values():
    verdict = check_text(_spec("pii", {"types": ["email"]}), "write to bob@example.org")
    assert verdict.tripped and verdict.reason == "found personal data (email)" and "bob" not in verdict.reason
    assert not check_text(_spec("pii", {"types": ["email"]}), "call +49 30 1234567").tripped


def test_max_length_and_json_schema():
    assert check_text(_spec("max_length", {"max_chars": 5}), "123456").tripped
    assert not check_text(_spec("max_length", {"max_chars": 5}), "12345").tripped
    schema = _spec("json_schema", {"schema": {"type": "object", "required": ["city"],
                                              "properties": {"city": {"type": "string"}}}})
    assert not check_text(schema, '{"city": "Oslo"}').tripped
    assert "not JSON" in check_text(schema, "Oslo").reason
    assert "schema at city" in check_text(schema, '{"city": 3}').reason


@pytest.mark.parametrize(("kind", "config", "problem"), [
    ("deny_list", {"words": []}, "deny_list needs"),
    ("regex", {"pattern": "(unclosed"}, "not a valid regular expression"),
    ("pii", {"types": ["ssn"]}, "pii types"),
    ("max_length", {"max_chars": 0}, "max_chars"),
    ("json_schema", {"schema": {"type": "nope"}}, "not a valid JSON Schema"),
    ("model_check", {}, "rubric"),
])
def test_unusable_configs_are_named(kind, config, problem):
    assert problem in config_problem(kind, config)


async def test_a_broken_guardrail_fails_closed_by_default_and_open_when_asked():
    broken = {"pattern": "(unclosed"}
    closed = await check(_spec("regex", broken), "anything", ask=None)
    assert closed.tripped and "could not run" in closed.reason
    opened = await check(_spec("regex", broken, on_error="fail_open"), "anything", ask=None)
    assert not opened.tripped and opened.error


async def test_model_check_pass_fail_and_a_route_that_fails():
    spec = _spec("model_check", {"rubric": "No medical advice."}, route="judge")
    seen = []

    async def answers(text):
        async def ask(guardrail, messages):
            seen.append(messages)
            if isinstance(text, Exception):
                raise text
            return text
        return ask

    assert not (await check(spec, "hi", ask=await answers("PASS\nfine"))).tripped
    failed = await check(spec, "take 3 pills", ask=await answers("FAIL\nIt gives a dose."))
    assert failed.tripped and "It gives a dose." in failed.reason
    down = await check(spec, "hi", ask=await answers(ConnectionError("down")))
    assert down.tripped and "could not run" in down.reason  # fail closed
    fail_open = _spec("model_check", {"rubric": "No medical advice."}, route="judge", on_error="fail_open")
    assert not (await check(fail_open, "hi", ask=await answers(ConnectionError("down")))).tripped
    unclear = await check(spec, "hi", ask=await answers("maybe"))
    assert unclear.tripped and "neither PASS nor FAIL" in unclear.reason
    assert seen[0] == model_check_messages("No medical advice.", "hi")


def test_the_user_message_names_the_guardrail_unless_the_admin_wrote_one():
    assert user_message(_spec("pii", {})) == "The agent's guardrail “g” stopped this answer."
    assert user_message(_spec("pii", {}, message="No personal data, please.")) == "No personal data, please."
