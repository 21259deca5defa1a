"""Guards for the run engine's promises that no other test pinned down (issue 24, "First:
tests that catch a broken refactor"). Each test names the mutation it catches; each was seen
failing with that mutation applied.

- Approvals: first match wins (two rules), and a rule on an MCP tool's exposed name
  (``time__*``) as well as on its own name.
- Runner: invalid-JSON tool arguments, a run-level ``model_error`` (a 400, an empty answer),
  the ``configuration`` and ``internal_error`` reasons.
- Compaction: old tool results are masked for the summarizer (observation masking); a
  skill's sub-run is never compacted.

Everything runs against the scripted model on a real socket, PostgreSQL and Redis; nothing
in the product is patched.
"""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async as sync_to_async

from agents.models import ApprovalAction, CapabilityBinding, CapabilityKind, approval_action
from agents.tests.factories import agent_with_route, bind_builtin
from capabilities.mcp.pool import mcp_pool
from capabilities.models import McpServer, Skill
from capabilities.tests.catalogue import time_template
from llm.testing import Fail, Reply, ToolCalls
from sessions.events import events_since_sync
from sessions.models import Approval, ChatSession, Compaction, Message, Run, ToolCall
from sessions.runner.compaction import SUMMARIZER_PROMPT, UNMASKED_TOOL_RESULTS
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@sync_to_async
def tool_calls(run_id: int) -> list[ToolCall]:
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


@sync_to_async
def run_events(run_id: int, event_type: str) -> list[dict]:
    run = Run.all_tenants.get(pk=run_id)
    return [e for e in events_since_sync(session_id=run.session_id, after_seq=0)
            if e["type"] == event_type and e["run_id"] == run_id]


def tool_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


# --- Approvals ---------------------------------------------------------------------------


def test_approval_action_first_matching_rule_wins_over_later_ones():
    """Mutation: ``for rule in reversed(policy)`` (last match wins) in ``approval_action``."""
    policy = [{"pattern": "delete_*", "action": "deny"}, {"pattern": "*", "action": "ask"},
              {"pattern": "delete_all", "action": "allow"}]
    assert approval_action(policy, "delete_all") == ApprovalAction.DENY
    assert approval_action(policy, "read") == ApprovalAction.ASK
    assert approval_action([], "read") == ApprovalAction.ALLOW
    # Any of the names matching is a match: the first rule that matches one of them decides.
    assert approval_action([{"pattern": "srv__*", "action": "ask"}, {"pattern": "get_*", "action": "deny"}],
                           "get_time", "srv__get_time") == ApprovalAction.ASK


async def test_two_rules_on_one_binding_the_first_match_decides_in_a_run(world, fake_llm):
    """Mutation: last match wins (``reversed(policy)`` in ``approval_action``): the echo
    would be denied and the big result allowed."""
    @sync_to_async
    def make():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
        bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_echo", "action": "allow"},
                                                          {"pattern": "*", "action": "deny"}])
        bind_builtin(agent, "test_big", approval_policy=[{"pattern": "*", "action": "deny"},
                                                         {"pattern": "test_big", "action": "allow"}])
        return agent

    agent = await make()
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"}), ("test_big", {"chars": 10})]), Reply("ok"))
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.error
    echo, big = await tool_calls(run.pk)
    assert (echo.name, echo.status, echo.result) == ("test_echo", "succeeded", "echo: ping")
    assert (big.name, big.status) == ("test_big", "failed")
    assert "policy does not allow the tool 'test_big'" in big.error and big.result == ""


@sync_to_async
def agent_with_time_server(world, url: str, policy: list[dict[str, str]]):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    server = McpServer.all_tenants.create(
        tenant=world.tenant, name="time", alias="time", transport="stdio", template=time_template(),
        parameters={"TIMEZONE": "UTC"},
    )
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER,
                                         mcp_server=server, approval_policy=policy)
    return agent


@pytest.fixture
async def close_the_mcp_pool():
    """Each test's event loop has its own pool: close it so no server process outlives the test."""
    yield
    await mcp_pool().aclose()


@pytest.mark.usefixtures("close_the_mcp_pool")
@pytest.mark.parametrize("pattern", ["time__*", "get_current_*"], ids=["exposed-name", "own-name"])
async def test_a_rule_on_an_mcp_tools_exposed_or_own_name_asks_before_it_runs(world, fake_llm, pattern):
    """Mutations: ``approval_action(policy, origin.name)`` (the exposed name ``time__…`` no
    longer matched: the ``exposed-name`` case runs the tool unasked) and
    ``approval_action(policy, name)`` (the own name no longer matched: ``own-name``)."""
    agent = await agent_with_time_server(world, fake_llm.base_url, [{"pattern": pattern, "action": "ask"}])
    fake_llm.script(ToolCalls([("time__get_current_time", {"timezone": "UTC"})]), Reply("It is now."))
    run = await post_message(agent=agent, user=world.member, content="time?")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "awaiting_approval", (run.status, run.error)
    [call] = await tool_calls(run.pk)
    assert (call.name, call.status, call.result) == ("time__get_current_time", "awaiting_approval", "")
    [approval] = await sync_to_async(lambda: list(Approval.all_tenants.filter(run_id=run.pk)))()
    assert (approval.status, approval.tool_name) == ("pending", "time__get_current_time")
    assert len(fake_llm.requests) == 1, "the run waits for the human, nothing else happens"


# --- Runner: tool arguments and run-level reasons ----------------------------------------


async def test_invalid_json_tool_arguments_fail_the_call_with_the_reason_and_never_run_the_tool(world, fake_llm):
    """Mutations: invalid JSON parsed as ``{}`` in ``_parse_arguments`` (test_big would then
    run and succeed); ``invalid_arguments`` not raised in ``_run_tool`` (same)."""
    @sync_to_async
    def make():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], tool_calls="text")
        bind_builtin(agent, "test_big")
        return agent

    agent = await make()
    # A text-mode model writes its call; the arguments are a JSON string that is not JSON.
    fake_llm.script(
        Reply('<tool_call>\n{"name": "test_big", "arguments": "{\\"chars\\": 5,"}\n</tool_call>'),
        Reply("I will fix my arguments next time."),
    )
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "I will fix my arguments next time."), run.error
    [call] = await tool_calls(run.pk)
    assert (call.name, call.status, call.arguments_raw) == ("test_big", "failed", '{"chars": 5,')
    assert call.error.startswith("The arguments are not valid JSON (") and call.result == ""
    [failed] = await run_events(run.pk, "tool_call_failed")
    assert failed["data"]["error"] == call.error
    [started] = await run_events(run.pk, "tool_call_started")
    assert started["data"]["arguments"] == '{"chars": 5,', "the raw text is shown when it does not parse"
    # The model reads why (text mode: tool results come back in a user message).
    assert "The arguments are not valid JSON" in fake_llm.requests[1]["messages"][-1]["content"]


async def test_a_400_from_the_model_fails_the_run_model_error_without_fallback(world, fake_llm, second_fake_llm):
    """Mutations: ``except ModelCallError`` ending the run with another reason (or not at
    all, which makes it ``internal_error``); a fallback to the second entry on a 400."""
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant,
                                                  base_urls=[fake_llm.base_url, second_fake_llm.base_url])
    fake_llm.script(Fail(400, body={"error": {"message": "Invalid value for 'messages'.", "type": "invalid_request_error"}}))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "model_error")
    assert run.error == "The model request failed: The model provider rejected the request. (bad_request)"
    assert second_fake_llm.requests == [], "a rejected request is not sent to the next entry"
    [failed] = await run_events(run.pk, "run_failed")
    assert failed["data"] == {"error": run.error, "reason": "model_error"}


async def test_an_empty_answer_fails_the_run_model_error(world, fake_llm):
    """Mutation: an empty answer accepted as the reply (``completed`` with ``""``)."""
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url])
    fake_llm.script(Reply("   "))
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason, run.error) == ("failed", "model_error", "The model returned an empty answer.")


async def test_an_agent_whose_route_has_no_entries_fails_configuration(world, fake_llm):
    """Mutation: the claim's ``ValueError`` not turned into ``configuration`` (the run would
    stay ``running`` or end ``internal_error``)."""
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[])
    run = await post_message(agent=agent, user=world.member, content="hi")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "configuration")
    assert "has no entries" in run.error and run.heartbeat_at is None and run.finished_at is not None
    [failed] = await run_events(run.pk, "run_failed")
    assert failed["data"]["reason"] == "configuration"
    assert fake_llm.requests == []


async def test_a_bug_in_the_loop_ends_the_run_internal_error_saying_what(world, fake_llm):
    """A run whose stored history is corrupt (an assistant message's tool call without its
    id, as no code path writes it) is a bug: the run must end ``failed`` / ``internal_error``
    with the exception named, never stay ``running``.

    Mutation: the ``except Exception`` around the loop in ``execute_run`` removed (the
    exception escapes and the run stays ``running``) or its reason changed."""
    agent = await sync_to_async(agent_with_route)(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = await post_message(agent=agent, user=world.member, content="hi")

    @sync_to_async
    def corrupt():
        session = ChatSession.all_tenants.get(pk=run.session_id)
        Message.all_tenants.create(tenant=world.tenant, session=session, run_id=run.pk, role="assistant",
                                   position=session.next_position, tool_calls=[{"name": "test_echo"}])
        ChatSession.all_tenants.filter(pk=session.pk).update(next_position=session.next_position + 1)

    await corrupt()
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reason) == ("failed", "internal_error")
    assert run.error == "Internal error: KeyError: 'id'"
    assert run.heartbeat_at is None and run.finished_at is not None
    [failed] = await run_events(run.pk, "run_failed")
    assert failed["data"] == {"error": run.error, "reason": "internal_error"}
    assert fake_llm.requests == []


# --- Compaction --------------------------------------------------------------------------

_TOO_LONG = Fail(400, body={"error": {"message": "This model's maximum context length is 8192 tokens",
                                      "code": "context_length_exceeded"}})


async def test_the_summarizer_sees_only_the_latest_tool_results_older_ones_are_stubs(world, fake_llm):
    """Observation masking. Mutation: ``shown = {m.pk for m in tool_rows}`` in
    ``compaction.transcript`` (every old result shown in full)."""
    @sync_to_async
    def make():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
        bind_builtin(agent, "test_big")
        bind_builtin(agent, "test_echo")
        return agent

    agent = await make()
    sizes = [301, 302, 303, 304, 305]
    fake_llm.script(
        ToolCalls([("test_big", {"chars": n}) for n in sizes]),  # one group with five results
        ToolCalls([("test_echo", {"text": "a"})]),
        ToolCalls([("test_echo", {"text": "b"})]),
        ToolCalls([("test_echo", {"text": "c"})]),
        ToolCalls([("test_echo", {"text": "d"})]),
        _TOO_LONG,  # compact: the user message and the five-result group are summarized
        Reply("## Goal\n- S"),
        Reply("done"),
    )
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "done"), run.error
    [summarizer] = [r for r in fake_llm.requests if r["messages"][0]["content"] == SUMMARIZER_PROMPT]
    text = summarizer["messages"][1]["content"]
    blocks = re.split(r"\n(?=TOOL |USER: |ASSISTANT: |EARLIER SUMMARY:)", text)  # a framed result spans lines
    results = [b for b in blocks if b.startswith("TOOL RESULT test_big: ")]
    assert len(results) == len(sizes), text
    stubs = [line for line in results if re.fullmatch(r"TOOL RESULT test_big: \[\d+ characters, omitted\]", line)]
    assert len(stubs) == len(sizes) - UNMASKED_TOOL_RESULTS == 2, text
    assert results[:2] == stubs, "the oldest results are the masked ones"
    assert all("0123456789abcdefghij" in block for block in results[2:]), "the latest ones are shown"
    assert "0123456789abcdefghij" not in "\n".join(stubs)


async def test_a_skills_sub_run_is_never_compacted(world, fake_llm):
    """A sub-run's history is short-lived and compactions move the session's cursor: it is
    sent as it is, even past the budget. Mutation: ``no_compaction = False`` in
    ``_run_loop`` (the sub-run would call the summarizer and write a Compaction)."""
    @sync_to_async
    def make():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], read_timeout_seconds=30.0)
        from llm.models import ModelRouteEntry

        ModelRouteEntry.all_tenants.filter(route=agent.route).update(max_input_tokens=2000)  # budget 1,400 tokens
        bind_builtin(agent, "test_echo")
        skill = Skill.all_tenants.create(tenant=world.tenant, name="helper", description="The helper skill.",
                                         instructions="You are the helper skill.", allowed_tools=["test_echo"])
        CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.SKILL, skill=skill)
        return agent

    agent = await make()
    fake_llm.script(
        ToolCalls([("helper", {"task": "echo two long texts"})]),  # the user's run
        ToolCalls([("test_echo", {"text": "a" * 1600})]),  # the sub-run, turn 1
        ToolCalls([("test_echo", {"text": "b" * 1600})]),  # turn 2
        Reply("sub-run done"),  # turn 3: its prompt is past the budget
        Reply("all done"),  # the user's run
    )
    run = await post_message(agent=agent, user=world.member, content="go")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert (run.status, run.reply) == ("completed", "all done"), run.error
    assert [r["messages"][0]["content"] == SUMMARIZER_PROMPT for r in fake_llm.requests] == [False] * 5
    sub = await sync_to_async(lambda: Run.all_tenants.get(parent_tool_call__run_id=run.pk))()
    assert (sub.status, sub.reply) == ("completed", "sub-run done")
    assert await sync_to_async(Compaction.all_tenants.count)() == 0
    sent = str(fake_llm.requests[3]["messages"])
    assert "a" * 1600 in sent and "b" * 1600 in sent, "the sub-run's last turn got its whole history"
