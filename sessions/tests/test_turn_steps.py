"""The turn's steps (sessions/runner/turn.py) with in-memory fakes: no database, no Redis, no
model server. The whole-run behaviour is pinned by the runner's integration tests
(test_runner*.py, test_compaction.py, test_durability*.py, ...); these pin each step's decision."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from llm.errors import AllEntriesFailed, ContextWindowExceeded, ModelCallError, StreamInterrupted
from llm.types import ChatMessage, Completion, TextDelta, ToolCallRequest, Usage
from sessions.models import RunFailureReason, RunStatus
from sessions.runner import turn
from sessions.runner.compaction import MAX_ATTEMPTS_PER_TURN, CompactionResult
from sessions.runner.ports import CallbackPublisher
from sessions.runner.spec import RunRequestOptions
from sessions.runner.toolset import Toolset
from sessions.runner.turn import CONTINUE, Completed, Continue, Failed, Paused, RunState

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _spec(**overrides: Any) -> Any:
    values = dict(run_id=1, session_id=1, tenant_id=1, depth=0, steer=False, loop_count=0, max_loop_count=10,
                  system_prompt="", entries=[SimpleNamespace(max_input_tokens=1000, input_price_per_mtok=0,
                                                           supports_images=False)],
                  max_tokens_per_run=None, max_cost_per_run_usd_micros=None, tenant_monthly_budget_usd_micros=None,
                  turn_timeout_seconds=5.0, request_options=RunRequestOptions(),
                  output_format=None, output_repairs=2, routing_rules=())
    values.update(overrides)
    return SimpleNamespace(**values)


class _Record:
    """The LLM-call recorder's surface the steps use."""

    def __init__(self) -> None:
        self.turn = 0

    @contextlib.asynccontextmanager
    async def holding_the_answer(self) -> Any:
        yield

    def take_answer(self) -> None:
        return None

    @contextlib.contextmanager
    def calls_for(self, purpose: str) -> Any:
        yield


class _Model:
    """A scripted model: each ``stream`` call plays the next script item (an exception is raised,
    a message is streamed as its text and then its Completion)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls = 0

    async def stream(self, messages: Any, tools: Any, *, compact_first: bool = False) -> Any:
        self.calls += 1
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        if item.content:
            yield TextDelta(item.content)
        yield Completion(message=item, usage=Usage(), finish_reason="stop", entry_index=0, model="m")


class _Store:
    """The run store's surface prepare and model_turn use: ``history`` returns
    ``self.history_value`` (each call's keyword arguments in ``loads``); saved answers go to ``saved``."""

    def __init__(self) -> None:
        self.history_value: Any = None
        self.loads: list[dict[str, Any]] = []
        self.saved: list[Any] = []

    async def history(self, run_id: int, **kwargs: Any) -> Any:
        self.loads.append(kwargs)
        return self.history_value

    async def assistant_message_save(self, *, spec: Any, turn: int, message: ChatMessage, reasoning: str,
                                     llm_call: Any) -> list:
        self.saved.append((turn, message))
        return []


@pytest.fixture(autouse=True)
def store() -> _Store:
    """The store every ``_state()`` of the test uses."""
    global _STORE
    _STORE = _Store()
    return _STORE


_STORE = _Store()


def _state(spec: Any = None, *, model: Any = None, published: list | None = None) -> RunState:
    async def publish(event_type: str, data: dict[str, Any]) -> None:
        if published is not None:
            published.append((event_type, data))

    return RunState.start(spec=spec or _spec(), publish=CallbackPublisher(publish), toolset=Toolset(), model=model or _Model(),
                          record=_Record(), store=_STORE)


def _history(text: str = "hello", *, tail: ChatMessage | None = None) -> Any:
    return SimpleNamespace(messages=[ChatMessage(role="user", content=text)], summary="", tail=tail,
                           compaction=None, rows=[])


# --- the dispatch ---------------------------------------------------------------------------


async def test_dispatch_none_hands_over_continue_restarts_an_end_is_returned():
    calls: list[str] = []
    script = {"prepare": [CONTINUE, None, None], "model": [None, None], "resolve": [None, Completed("done")]}

    def step(name: str) -> Any:
        async def run(state: Any) -> Any:
            calls.append(name)
            return script[name].pop(0)
        return run

    outcome = await turn.run_turns(_state(), (step("prepare"), step("model"), step("resolve")))
    assert outcome == Completed("done")
    # turn 1: prepare restarts; turn 2: all three, resolve's None starts turn 3; turn 3 ends.
    assert calls == ["prepare", "prepare", "model", "resolve", "prepare", "model", "resolve"]


async def test_dispatch_stops_at_the_step_that_ends_the_run():
    calls: list[str] = []

    async def prepare(state: Any) -> Any:
        calls.append("prepare")
        return Failed(RunFailureReason.BUDGET_EXCEEDED, "over")

    async def model(state: Any) -> Any:
        calls.append("model")

    outcome = await turn.run_turns(_state(), (prepare, model))
    assert outcome == Failed(RunFailureReason.BUDGET_EXCEEDED, "over")
    assert calls == ["prepare"]


def test_ends_carry_what_the_run_end_path_reads():
    assert (Completed("hi").status, Completed("hi").reply, Completed("hi").reason) == (RunStatus.COMPLETED, "hi", "")
    failed = Failed(RunFailureReason.MODEL_ERROR, "boom")
    assert (failed.status, failed.reason, failed.error, failed.reply) == (RunStatus.FAILED, "model_error", "boom", "")
    assert Paused().status == RunStatus.AWAITING_APPROVAL
    assert not hasattr(Continue(), "status")  # never an end of the run


# --- prepare: the compaction decision -------------------------------------------------------


class _Compactions:
    """``history``: what the store returns (set it to change); ``results``: what compact
    returns, in order; ``compactions``: the attempts compact was called with."""

    def __init__(self, store: _Store) -> None:
        self._store = store
        self.results: list[CompactionResult] = []
        self.compactions: list[int] = []
        store.history_value = _history()

    @property
    def history(self) -> Any:
        return self._store.history_value

    @history.setter
    def history(self, value: Any) -> None:
        self._store.history_value = value


@pytest.fixture
def fake_store(monkeypatch, store):
    fake = _Compactions(store)

    async def compact(**kwargs: Any) -> CompactionResult:
        fake.compactions.append(kwargs["attempt"])
        return fake.results.pop(0)

    monkeypatch.setattr(turn, "compact", compact)
    return fake


async def test_prepare_under_the_window_goes_on_to_the_model(fake_store):
    state = _state()
    assert await turn.prepare(state) is None
    assert fake_store.compactions == []
    assert state.messages[-1].content == "hello" and state.offered == [] and not state.final_turn


async def test_prepare_fails_after_the_last_compaction_attempt_fails(fake_store):
    fake_store.history = _history("word " * 4000)  # far over 1,000 tokens x BUDGET_RATIO
    fake_store.results = [CompactionResult(ok=False, error="summary empty")] * MAX_ATTEMPTS_PER_TURN
    state = _state()
    for _ in range(MAX_ATTEMPTS_PER_TURN - 1):
        assert await turn.prepare(state) is CONTINUE
        assert state.known_cursor == {}  # the cursor is read again after a compaction
    outcome = await turn.prepare(state)
    assert isinstance(outcome, Failed) and outcome.reason == RunFailureReason.COMPACTION_FAILED
    assert f"({MAX_ATTEMPTS_PER_TURN} attempts): summary empty" in outcome.error
    assert fake_store.compactions == list(range(1, MAX_ATTEMPTS_PER_TURN + 1))


async def test_prepare_with_nothing_to_compact_sends_the_turn_to_the_model(fake_store):
    fake_store.history = _history("word " * 4000)
    fake_store.results = [CompactionResult(ok=False, nothing_to_compact=True)]
    state = _state()
    assert await turn.prepare(state) is CONTINUE
    assert await turn.prepare(state) is None  # no second attempt: the model (or a larger entry) decides
    assert fake_store.compactions == [1]


async def test_prepare_never_compacts_a_sub_run(fake_store):
    fake_store.history = _history("word " * 4000)
    assert await turn.prepare(_state(_spec(depth=1))) is None
    assert fake_store.compactions == []


async def test_prepare_compacts_a_rejected_prompt_below_the_budget(fake_store):
    fake_store.results = [CompactionResult(ok=True, tokens_after=10)]
    state = _state()
    state.force_compaction = True
    assert await turn.prepare(state) is CONTINUE
    assert fake_store.compactions == [1] and not state.force_compaction


async def test_prepare_stops_at_the_loop_limit_and_marks_the_final_turn(fake_store):
    state = _state(_spec(max_loop_count=3))
    state.turn = 2
    assert await turn.prepare(state) is None and state.final_turn
    state.turn = 3
    outcome = await turn.prepare(state)
    assert isinstance(outcome, Failed) and outcome.reason == RunFailureReason.MAX_LOOP_COUNT


async def test_prepare_ends_a_resumed_run_that_had_answered(fake_store):
    fake_store.history = _history(tail=ChatMessage(role="assistant", content="the answer"))
    assert await turn.prepare(_state()) == Completed("the answer")


# --- model turn: failures -------------------------------------------------------------------


@pytest.fixture
def saved(store):
    """The answers model_turn saved: ``[(turn, message)]``."""
    return store.saved


async def test_a_stream_broken_twice_in_one_turn_fails_the_run(saved):
    published: list = []
    broke = StreamInterrupted(ModelCallError("server", "reset"))
    state = _state(model=_Model(broke, broke), published=published)
    assert await turn.model_turn(state) is CONTINUE
    assert published[-1] == ("model_retry", {"turn": 0, "error_class": "server", "turn_restarted": True})
    outcome = await turn.model_turn(state)
    assert isinstance(outcome, Failed) and outcome.reason == RunFailureReason.STREAM_INTERRUPTED
    assert saved == []


async def test_a_broken_stream_retried_then_answered_is_saved_once(saved):
    answer = ChatMessage(role="assistant", content="fine")
    state = _state(model=_Model(StreamInterrupted("cut"), answer))
    assert await turn.model_turn(state) is CONTINUE
    assert await turn.model_turn(state) is None
    assert saved == [(0, answer)] and state.turn == 1
    assert await turn.resolve(state) == Completed("fine")


async def test_a_rejected_prompt_compacts_first_then_fails_with_context_window(saved):
    state = _state(model=_Model(*[ContextWindowExceeded(estimated_prompt_tokens=9000, largest_window_tokens=1000)] * 2))
    assert await turn.model_turn(state) is CONTINUE and state.force_compaction
    state.compaction_exhausted = True
    outcome = await turn.model_turn(state)
    assert isinstance(outcome, Failed) and outcome.reason == RunFailureReason.CONTEXT_WINDOW


@pytest.mark.parametrize("error, reason", [
    (AllEntriesFailed([]), RunFailureReason.MODEL_UNAVAILABLE),
    (ModelCallError("bad_request", "nope"), RunFailureReason.MODEL_ERROR),
    (TimeoutError(), RunFailureReason.TURN_TIMEOUT),
])
async def test_model_failures_end_the_run_with_their_reason(saved, error, reason):
    outcome = await turn.model_turn(_state(model=_Model(error)))
    assert isinstance(outcome, Failed) and outcome.reason == reason


async def test_the_final_turn_drops_tool_calls_and_an_empty_answer_hits_the_loop_limit(saved):
    call = ToolCallRequest(id="c1", name="echo", arguments='{}')
    state = _state(_spec(max_loop_count=1), model=_Model(ChatMessage(role="assistant", content="", tool_calls=(call,))))
    state.final_turn = True
    assert await turn.model_turn(state) is None
    assert saved[0][1].tool_calls == ()
    outcome = await turn.resolve(state)
    assert isinstance(outcome, Failed) and outcome.reason == RunFailureReason.MAX_LOOP_COUNT


async def test_an_empty_answer_before_the_final_turn_is_a_model_error(saved):
    state = _state(model=_Model(ChatMessage(role="assistant", content="  ")))
    assert await turn.model_turn(state) is None
    outcome = await turn.resolve(state)
    assert isinstance(outcome, Failed) and outcome.reason == RunFailureReason.MODEL_ERROR
