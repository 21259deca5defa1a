"""The turn's tool choice (sessions.runner.turn.turn_tool_choice): a run's first model turn must
call the tool marked ``call_first``; the choice is ``auto`` from the next turn on, for a resumed
run past its first turn, for a sub-run, on the final turn (no tools offered) and when no tool
asks for it. In-memory fakes (no database, no model server)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

from capabilities.tools import Tool, ToolContext, ToolResult
from llm.types import ChatMessage, Completion, ToolCallRequest, ToolSpec, Usage
from sessions.runner import turn
from sessions.runner.ports import CallbackPublisher
from sessions.runner.spec import RunRequestOptions
from sessions.runner.toolset import Toolset
from sessions.runner.turn import RunState


class _Search(Tool):
    def __init__(self, name: str, *, call_first: bool) -> None:
        self.spec = ToolSpec(name=name, description="Search.")
        self.call_first = call_first

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(content="[1] a passage")


class _Model:
    """Answers each turn with the next scripted message; keeps the tool choice each call asked for
    (``"auto"`` when the caller passed none, as the router's default)."""

    def __init__(self, *script: ChatMessage) -> None:
        self.script = list(script)
        self.choices: list[str] = []

    async def stream(self, messages: Any, tools: Any, *, compact_first: bool = False, tool_choice: str = "auto") -> Any:
        self.choices.append(tool_choice)
        yield Completion(message=self.script.pop(0), usage=Usage(), finish_reason="stop", entry_index=0, model="m")


class _Store:
    async def history(self, run_id: int, **kwargs: Any) -> Any:
        return SimpleNamespace(messages=[ChatMessage(role="user", content="How do I start it?")], summary="",
                               tail=None, compaction=None, rows=[])

    async def assistant_message_save(self, **kwargs: Any) -> list:
        return []


class _Record:
    turn = 0

    @contextlib.asynccontextmanager
    async def holding_the_answer(self) -> Any:
        yield

    def take_answer(self) -> None:
        return None

    @contextlib.contextmanager
    def calls_for(self, purpose: str) -> Any:
        yield


def _state(*tools: Tool, hidden: tuple[str, ...] = (), model: _Model | None = None, **spec: Any) -> RunState:
    values = dict(run_id=1, session_id=1, tenant_id=1, depth=0, steer=False, loop_count=0, max_loop_count=10,
                  system_prompt="", entries=[SimpleNamespace(max_input_tokens=10_000, input_price_per_mtok=0,
                                                           supports_images=False)],
                  max_tokens_per_run=None, max_cost_per_run_usd_micros=None, tenant_monthly_budget_usd_micros=None,
                  turn_timeout_seconds=5.0, request_options=RunRequestOptions(),
                  output_format=None, output_repairs=2, routing_rules=())
    values.update(spec)

    async def publish(event_type: str, data: dict[str, Any]) -> None:
        return None

    toolset = Toolset(tools={t.spec.name: t for t in tools}, hidden=set(hidden))
    return RunState.start(spec=SimpleNamespace(**values), publish=CallbackPublisher(publish), toolset=toolset,
                          model=model or _Model(), record=_Record(), store=_Store())


def _call(name: str) -> ChatMessage:
    return ChatMessage(role="assistant", tool_calls=(ToolCallRequest(id="c1", name=name, arguments="{}"),))


async def test_the_first_turn_must_call_the_call_first_tool_and_the_next_turn_is_auto():
    model = _Model(_call("knowledge_search"), ChatMessage(role="assistant", content="Run make run [1]."))
    state = _state(_Search("echo", call_first=False), _Search("knowledge_search", call_first=True), model=model)

    assert await turn.prepare(state) is None
    assert state.tool_choice == "knowledge_search"
    assert await turn.model_turn(state) is None
    assert state.turn == 1
    assert await turn.prepare(state) is None  # the next turn (after the tool call ran)
    assert state.tool_choice == "auto"
    assert await turn.model_turn(state) is None
    assert model.choices == ["knowledge_search", "auto"]


async def test_a_run_resumed_after_its_first_turn_does_not_force_again():
    state = _state(_Search("knowledge_search", call_first=True), loop_count=1)  # stored with the first turn
    assert await turn.prepare(state) is None
    assert state.tool_choice == "auto"


async def test_a_run_resumed_before_its_first_turn_was_answered_forces_it():
    state = _state(_Search("knowledge_search", call_first=True), loop_count=0)
    assert await turn.prepare(state) is None
    assert state.tool_choice == "knowledge_search"


async def test_no_forced_call_in_a_sub_run_on_the_final_turn_or_without_such_a_tool():
    search = _Search("knowledge_search", call_first=True)
    cases = {
        "sub-run": _state(search, depth=1),
        "final turn (no tools offered)": _state(search, max_loop_count=1),
        "no call_first tool": _state(_Search("knowledge_search", call_first=False)),
        "hidden tool": _state(search, hidden=("knowledge_search",)),
    }
    for case, state in cases.items():
        assert await turn.prepare(state) is None, case
        assert state.tool_choice == "auto", case


async def test_the_exposed_name_is_forced():
    state = _state(_Search("docs__knowledge_search", call_first=True))  # renamed by the toolset
    assert await turn.prepare(state) is None
    assert state.tool_choice == "docs__knowledge_search"
