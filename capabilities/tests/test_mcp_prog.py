"""Progress, log messages, cancellation and sampling through the MCP pool (issue 37), against
:mod:`capabilities.tests.prog_test_server` in both protocol eras. No database: the run's
ports (the session store, the model sampler) are fakes here; the run-level test is
``sessions/tests/test_mcp_prog_run.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from capabilities.mcp.binding_config import binding_config_errors, sampling_policy_of
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.operations import McpToolInfo
from capabilities.mcp.pool import McpPool
from capabilities.mcp.tool import McpTool, ProgressThrottle
from capabilities.tests.confined_servers import until
from capabilities.tests.prog_test_server import ProgState, serve_prog
from capabilities.tools import InputForUser, SamplingRequest, ToolContext, ToolError
from llm.types import ChatMessage, Completion, ToolCallRequest, Usage

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def prog() -> Iterator[tuple[str, ProgState]]:
    with serve_prog() as served:
        yield served


@pytest.fixture
async def pool(prog: Any) -> AsyncIterator[McpPool]:
    """The test's pool, closed before the server stops (an open session would hold its shutdown)."""
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()


class LogStore:
    """The session store's log port, in memory."""

    def __init__(self) -> None:
        self.saved: dict[int, list[dict[str, Any]]] = {}

    async def tool_call_log_save(self, *, tool_call_id: int, entries: list[dict[str, Any]]) -> None:
        self.saved.setdefault(tool_call_id, []).extend(entries)


class Sampler:
    """A model sampler answering from a script; keeps the requests."""

    def __init__(self, *answers: ChatMessage) -> None:
        self.answers = list(answers)
        self.requests: list[SamplingRequest] = []

    async def __call__(self, request: SamplingRequest) -> Completion:
        self.requests.append(request)
        return Completion(message=self.answers.pop(0), usage=Usage(3, 2), finish_reason="stop", entry_index=0,
                          model="fake-model")


def session_for(pool: McpPool, url: str, mode: str) -> Any:
    config = McpServerConfig(alias="prog", transport="streamable_http", url=url, connect_timeout_seconds=10.0,
                             protocol_mode=mode)  # type: ignore[arg-type]
    return pool.session(tenant_id=1, server_id=1, config=config)


def tool(session: Any, name: str, config: dict[str, Any] | None = None) -> McpTool:
    return McpTool(connection=session, info=McpToolInfo(name=name, description="", input_schema={}),
                   exposed_name=f"prog__{name}", call_timeout_seconds=20, binding_config=config)


def context(*, sample: Any = None, call_id: int = 7) -> tuple[ToolContext, LogStore, list[tuple[str, dict]]]:
    events: list[tuple[str, dict]] = []

    async def publish(event_type: str, data: dict[str, Any]) -> None:
        events.append((event_type, data))

    store = LogStore()
    return (ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=call_id, publish=publish,
                        store=store, sample=sample),  # type: ignore[arg-type]
            store, events)


def test_progress_is_throttled_to_four_a_second_but_the_last_step_always_shows() -> None:
    now = [100.0]
    throttle = ProgressThrottle(clock=lambda: now[0])
    admitted = []
    for step in range(1, 11):  # ten steps within 0.2 s
        now[0] += 0.02
        admitted.append(throttle.admit(step, 10))
    assert admitted == [True] + [False] * 8 + [True]
    now[0] += 0.25
    assert throttle.admit(11, None)


def test_binding_config_is_checked() -> None:
    assert binding_config_errors({}) == []
    assert binding_config_errors({"log_level": "info", "sampling": {"allowed": True, "max_tokens": 200}}) == []
    assert binding_config_errors({"log_level": "loud", "sampling": {"allowed": "yes", "require_approval": True,
                                                                    "max_tokens": 0, "x": 1}, "other": 1}) == [
        "Unknown key 'other' (an MCP server binding takes log_level, elicitation_timeout_seconds, sampling).",
        "log_level must be one of debug, info, notice, warning, error, critical, alert, emergency.",
        "Unknown sampling key 'x'.", "sampling.allowed must be true or false.",
        "sampling.max_tokens must be a whole number from 1 to 32000.",
    ]
    assert binding_config_errors({"sampling": {"allowed": True, "require_approval": "yes"}}) == [
        "sampling.require_approval must be true or false."]
    assert sampling_policy_of({"sampling": {"allowed": "yes"}}).allowed is False  # invalid: refuse everything
    assert sampling_policy_of({"sampling": {"allowed": True, "require_approval": True}}).require_approval is True


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_progress_events_and_log_messages_at_the_binding_level(pool: McpPool, prog: Any, mode: str) -> None:
    url, state = prog
    session = session_for(pool, url, mode)
    ctx, store, events = context()
    result = await tool(session, "steps").execute({"n": 3}, ctx)
    assert result.content == "done"
    progress = [data for kind, data in events if kind == "tool_call_progress"]
    assert progress[0] == {"tool_call_id": 7, "message": "step 1 of 3", "progress": 1.0, "total": 3.0}
    assert progress[-1]["progress"] == 3.0  # the last step is never throttled away

    await tool(session, "chatty", {"log_level": "info"}).execute({}, ctx)
    saved = store.saved[7]
    assert [(e["level"], e["logger"], e["data"]) for e in saved] == [
        ("info", "chatty", "i"), ("warning", "chatty", "w"), ("error", "chatty", {"code": 7, "why": "x"})]
    assert all(e["at"] for e in saved)
    # Handshake era: the server was asked for the binding's level (warning for ``steps``, then
    # the lower info; never raised again: the session is shared); 2026-07-28: per request.
    assert state.levels == (["warning", "info"] if mode == "legacy" else [])

    ctx2, store2, _ = context(call_id=8)
    await tool(session, "chatty").execute({}, ctx2)  # default: warning and above
    assert [e["level"] for e in store2.saved[8]] == ["warning", "error"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_sampling_is_refused_unless_the_binding_allows_it(pool: McpPool, prog: Any, mode: str) -> None:
    url, state = prog
    session = session_for(pool, url, mode)
    sampler = Sampler(ChatMessage(role="assistant", content="A short summary."))
    ctx, _, _ = context(sample=sampler)
    if mode == "legacy":  # the server hears the refusal and goes on
        result = await tool(session, "summarize").execute({"text": "long"}, ctx)
        assert result.content.startswith("refused: MCP server 'prog' asked to use the agent's model (sampling)")
    else:  # 2026-07-28 cannot carry a refusal: the call fails with the reason
        with pytest.raises(ToolError) as refused:
            await tool(session, "summarize").execute({"text": "long"}, ctx)
        assert refused.value.code == "sampling_refused" and "does not allow" in refused.value.message
    assert sampler.requests == []

    allowed = {"sampling": {"allowed": True}}
    result = await tool(session, "summarize", allowed).execute({"text": "long"}, ctx)
    assert result.content == "summary: A short summary."
    [request] = sampler.requests
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "You write one-line summaries."), ("user", "Summarize: long")]
    assert request.tools == () and request.max_output_tokens == 1024  # the server asked 5,000: capped


APPROVED = {"sampling": {"allowed": True, "require_approval": True}}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_sampling_request_waits_for_approval_then_the_model_answers(pool: McpPool, prog: Any,
                                                                             mode: str) -> None:
    """``require_approval``: the call stops with the person's question (the model not called);
    executed again with the approval, the model answers the server's request. 2025-11-25:
    the call stays open meanwhile (held in the pool); 2026-07-28: it is sent again."""
    url, state = prog
    session = session_for(pool, url, mode)
    sampler = Sampler(ChatMessage(role="assistant", content="A short summary."))
    ctx, _, _ = context(sample=sampler)
    summarize = tool(session, "summarize", APPROVED)
    with pytest.raises(InputForUser) as asked:
        await summarize.execute({"text": "a long text"}, ctx)
    request = asked.value.request
    assert (request["type"], request["protocol"], request["server"], request["tool"]) == (
        "sampling", "held" if mode == "legacy" else "input_required", "prog", "summarize")
    [item] = request["requests"]
    assert item["shown"] == {"messages": [{"role": "user", "text": "Summarize: a long text"}],
                             "system_prompt": "You write one-line summaries.", "max_tokens": 1024,
                             "offers_tools": False, "tools": []}
    assert sampler.requests == [] and len(state.samples) == 1

    ctx.input_answer = {"request": request, "action": "accept", "reason": ""}
    result = await summarize.execute({"text": "a long text"}, ctx)
    assert result.content == "summary: A short summary."
    [sampled] = sampler.requests
    assert [m.content for m in sampled.messages] == ["You write one-line summaries.", "Summarize: a long text"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_denied_sampling_request_tells_the_server_or_fails_the_call(pool: McpPool, prog: Any,
                                                                            mode: str) -> None:
    url, _ = prog
    session = session_for(pool, url, mode)
    sampler = Sampler()
    ctx, _, _ = context(sample=sampler, call_id=8)
    summarize = tool(session, "summarize", APPROVED)
    with pytest.raises(InputForUser) as asked:
        await summarize.execute({"text": "x"}, ctx)
    ctx.input_answer = {"request": asked.value.request, "action": "decline", "reason": "not now"}
    declined = "The user declined MCP server 'prog''s request to use the agent's model (sampling). Their reason: not now"
    if mode == "legacy":  # the server gets an MCP error and goes on
        assert (await summarize.execute({"text": "x"}, ctx)).content.startswith(f"refused: {declined}")
    else:  # 2026-07-28 cannot refuse one request: the call fails with the reason
        with pytest.raises(ToolError) as failed:
            await summarize.execute({"text": "x"}, ctx)
        assert failed.value.code == "sampling_declined" and failed.value.message.startswith(declined)
    assert sampler.requests == []


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_request_the_binding_refuses_anyway_asks_nobody(pool: McpPool, prog: Any, mode: str) -> None:
    url, _ = prog
    session = session_for(pool, url, mode)
    ctx, _, _ = context(sample=Sampler(), call_id=9)
    pick = tool(session, "pick", APPROVED)  # offers tools; allow_tools is off
    if mode == "legacy":
        assert "sampling.allow_tools" in (await pick.execute({}, ctx)).content
    else:
        with pytest.raises(ToolError, match="sampling.allow_tools"):
            await pick.execute({}, ctx)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_tool_use_in_sampling_only_when_allowed(pool: McpPool, prog: Any, mode: str) -> None:
    url, _ = prog
    session = session_for(pool, url, mode)
    call = ToolCallRequest(id="call_1", name="lookup", arguments='{"word": "mcp"}')
    sampler = Sampler(ChatMessage(role="assistant", content="", tool_calls=(call,)))
    ctx, _, _ = context(sample=sampler)
    no_tools = tool(session, "pick", {"sampling": {"allowed": True}})
    if mode == "legacy":
        assert "sampling.allow_tools" in (await no_tools.execute({}, ctx)).content
    else:
        with pytest.raises(ToolError, match="sampling.allow_tools"):
            await no_tools.execute({}, ctx)
    result = await tool(session, "pick", {"sampling": {"allowed": True, "allow_tools": True}}).execute({}, ctx)
    assert result.content == "used: lookup"
    assert [t.name for t in sampler.requests[0].tools] == ["lookup"]


async def test_cancelled_calls_send_notifications_cancelled(pool: McpPool, prog: Any) -> None:
    """2025-11-25 over Streamable HTTP: a cancelled caller's call gets ``notifications/cancelled``
    (on 2026-07-28 the SDK closes the request's stream instead: that wire has no notification)."""
    url, state = prog
    session = session_for(pool, url, "legacy")
    calls = [asyncio.create_task(tool(session, "block").execute({}, context(call_id=i)[0])) for i in (1, 2)]
    await until(lambda: state.blocked == 2)
    for call in calls:
        call.cancel()
    await asyncio.wait(calls)
    await until(lambda: len(state.cancelled) == 2)
    assert len(set(state.cancelled)) == 2 and session.state == "ready"


async def test_a_sampling_request_over_the_run_budget_is_refused_before_the_model():
    from types import SimpleNamespace

    from sessions.runner.sampling import run_sampler

    spec = SimpleNamespace(run_id=1, tenant_id=1, max_tokens_per_run=100, max_cost_per_run_usd_micros=None,
                           tenant_monthly_budget_usd_micros=None, entries=[SimpleNamespace(input_price_per_mtok=0)])

    async def usage(run_id):
        return SimpleNamespace(tokens=95, cost_usd_micros=0)

    def no_model(*args):
        raise AssertionError("the model must not be asked")

    state = SimpleNamespace(spec=spec, store=SimpleNamespace(usage=usage), record=SimpleNamespace(turn=0),
                            current_entry=0, publish=None)
    sample = run_sampler(state, SimpleNamespace(model=no_model))
    with pytest.raises(ToolError) as refused:
        await sample(SamplingRequest(messages=(ChatMessage(role="user", content="x " * 50),)))
    assert refused.value.code == "budget_exceeded" and "an MCP server's sampling request" in refused.value.message
