"""The four guardrail points in a run, over the in-memory ports (sessions/tests/fakes.py): input,
tool call (block, mask the arguments), tool result (block, mask: not a trip), output (a trip
retracts the streamed answer), and a model check that cannot run (fail closed)."""

from __future__ import annotations

import pytest

from guardrails.checks import GuardrailSpec
from sessions.models import RunFailureReason, RunStatus, ToolCallStatus
from sessions.runner import guarding
from sessions.runner.loop import execute_run
from sessions.tests.fakes import (
    EchoTool,
    FakePorts,
    MemoryRunStore,
    ScriptedModel,
    reply,
    run_spec,
    tool_call,
    toolset_of,
)


@pytest.fixture
def audits(monkeypatch):
    """The trips' audit records, kept here instead of the database."""
    written = []

    async def write(**kwargs):
        written.append(kwargs)

    monkeypatch.setattr(guarding, "audit_write", write)
    return written


def _run(guardrails, *script, user_message="hello", tools=()):
    spec = run_spec(guardrails=tuple(guardrails), agent_id=7)
    return FakePorts(MemoryRunStore(spec, user_message=user_message), ScriptedModel(*script), toolset_of(*tools))


def _tripped(fake):
    return [e[1] for e in fake.events if e[0] == "guardrail_tripped"]


async def test_an_input_guardrail_stops_the_run_before_any_model_call(audits):
    fake = _run([GuardrailSpec(name="no secrets", point="input", kind="deny_list", config={"words": ["password"]})],
                reply("never"), user_message="What is the admin PASSWORD?")
    await execute_run(1, ports=fake.ports)
    outcome = fake.store.outcome
    assert (outcome.status, outcome.reason) == (RunStatus.FAILED, RunFailureReason.GUARDRAIL_TRIPPED)
    assert outcome.error == "The agent's guardrail “no secrets” stopped this message."
    assert fake.model_.prompts == []  # the model was never called
    assert _tripped(fake) == [{"guardrail": "no secrets", "point": "input", "kind": "deny_list",
                               "message": outcome.error, "retracted": False}]
    assert fake.types()[-2:] == ["guardrail_tripped", "run_failed"]
    [audit] = audits
    assert audit["run_id"] == 1 and audit["detail"]["guardrail"] == "no secrets" and audit["detail"]["agent_id"] == 7


async def test_an_input_that_passes_runs_as_usual(audits):
    fake = _run([GuardrailSpec(name="no secrets", point="input", kind="deny_list", config={"words": ["password"]})],
                reply("hi"), user_message="hello")
    await execute_run(1, ports=fake.ports)
    assert fake.store.status == RunStatus.COMPLETED and audits == [] and _tripped(fake) == []


async def test_a_tool_call_guardrail_blocks_the_call_and_ends_the_run(audits):
    echo = EchoTool()
    fake = _run([GuardrailSpec(name="no deletes", point="tool_call", kind="regex", config={"pattern": "rm -rf"},
                               message="Deleting files is not allowed.")],
                tool_call("echo", '{"text": "rm -rf /"}'), reply("never"), tools=(echo,))
    await execute_run(1, ports=fake.ports)
    [call] = fake.store.calls.values()
    assert echo.calls == 0 and call["status"] == ToolCallStatus.FAILED
    assert call["error"] == "Deleting files is not allowed. (guardrail “no deletes”)"
    assert (fake.store.outcome.reason, fake.store.outcome.error) == ("guardrail_tripped", call["error"])
    assert len(fake.model_.prompts) == 1  # no turn after the blocked call
    assert _tripped(fake)[0]["point"] == "tool_call" and len(audits) == 1


async def test_a_tool_call_guardrail_masks_the_arguments(audits):
    echo = EchoTool()
    fake = _run([GuardrailSpec(name="pii", point="tool_call", kind="pii", action="mask")],
                tool_call("echo", '{"text": "mail bob@example.org now"}'), reply("done"), tools=(echo,))
    await execute_run(1, ports=fake.ports)
    [call] = fake.store.calls.values()
    assert (call["status"], call["result"]) == (ToolCallStatus.SUCCEEDED, "echo: mail [EMAIL] now")
    assert fake.store.status == RunStatus.COMPLETED and audits == [] and _tripped(fake) == []


async def test_a_tool_result_is_masked_without_a_trip(audits):
    fake = _run([GuardrailSpec(name="pii", point="tool_result", kind="pii", action="mask", config={"types": ["iban"]})],
                tool_call("echo", '{"text": "IBAN DE89 3704 0044 0532 0130 00"}'), reply("done"), tools=(EchoTool(),))
    await execute_run(1, ports=fake.ports)
    [call] = fake.store.calls.values()
    assert call["result"] == "echo: IBAN [IBAN]"  # what the trace shows
    assert fake.model_.prompts[1][-1].content == "echo: IBAN [IBAN]"  # what the model read
    assert fake.store.status == RunStatus.COMPLETED and audits == [] and _tripped(fake) == []


async def test_a_tool_result_guardrail_blocks_the_result(audits):
    fake = _run([GuardrailSpec(name="short results", point="tool_result", kind="max_length", config={"max_chars": 10})],
                tool_call("echo", '{"text": "a long long result"}'), reply("never"), tools=(EchoTool(),))
    await execute_run(1, ports=fake.ports)
    [call] = fake.store.calls.values()
    assert call["status"] == ToolCallStatus.FAILED and "short results" in call["error"]
    assert fake.store.outcome.reason == "guardrail_tripped" and len(fake.model_.prompts) == 1


async def test_an_output_guardrail_retracts_the_streamed_answer(audits):
    fake = _run([GuardrailSpec(name="no cards", point="output", kind="pii", config={"types": ["card"]})],
                reply("Your card is 4111 1111 1111 1111."))
    await execute_run(1, ports=fake.ports)
    streamed = [e[1]["text"] for e in fake.events if e[0] == "content_token"]
    assert "".join(streamed) == "Your card is 4111 1111 1111 1111."  # it went out: hence the retraction
    assert _tripped(fake) == [{"guardrail": "no cards", "point": "output", "kind": "pii",
                               "message": "The agent's guardrail “no cards” stopped this answer.", "retracted": True}]
    outcome = fake.store.outcome
    assert (outcome.status, outcome.reason, outcome.reply) == (RunStatus.FAILED, "guardrail_tripped", "")
    assert [m["role"] for m in fake.store.messages] == ["user"], "the answer is not kept in the history"
    assert audits[0]["detail"]["retracted"] is True


async def test_guardrails_run_in_order_and_the_first_trip_wins(audits):
    fake = _run([GuardrailSpec(name="first", point="output", kind="max_length", config={"max_chars": 3}),
                 GuardrailSpec(name="second", point="output", kind="deny_list", config={"words": ["long"]})],
                reply("a long answer"))
    await execute_run(1, ports=fake.ports)
    assert [t["guardrail"] for t in _tripped(fake)] == ["first"]


async def test_a_model_check_that_cannot_run_fails_closed(audits, monkeypatch):
    async def route_down(guardrail, messages):
        raise ConnectionError("the judge's model is down")

    monkeypatch.setattr(guarding, "_ask_for", lambda spec: route_down)
    fake = _run([GuardrailSpec(name="judge", point="output", kind="model_check", config={"rubric": "Be polite."},
                               route="judge")], reply("ok"))
    await execute_run(1, ports=fake.ports)
    assert fake.store.outcome.reason == "guardrail_tripped"
    assert "could not run" in audits[0]["detail"]["reason"]


async def test_a_run_without_guardrails_publishes_no_guardrail_event(audits):
    fake = _run([], tool_call("echo", '{"text": "bob@example.org"}'), reply("done"), tools=(EchoTool(),))
    await execute_run(1, ports=fake.ports)
    assert fake.store.status == RunStatus.COMPLETED and guarding.current_guard.get() is None
    assert list(fake.store.calls.values())[0]["result"] == "echo: bob@example.org"
