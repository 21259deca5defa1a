"""LoopBatch (agent_platform/loop_batch.py): keys asked for within a window answered by one call."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from agent_platform.loop_batch import LoopBatch

_caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")


class Recorder:
    """An ``answer`` that records each call's keys (and the caller context it ran in) and
    answers ``key * 10``, or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[list[int]] = []
        self.contexts: list[str] = []
        self.error = error

    async def __call__(self, keys: list[int]) -> list[int]:
        self.calls.append(list(keys))
        self.contexts.append(_caller.get())
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        return [key * 10 for key in keys]


async def test_keys_asked_within_the_window_share_one_call_each_key_once() -> None:
    answer = Recorder()
    batch = LoopBatch(answer, lambda: 0.05)
    values = await asyncio.wait_for(asyncio.gather(*(batch.ask(k) for k in (3, 1, 3, 2))), 5)
    assert values == [30, 10, 30, 20]
    assert answer.calls == [[3, 1, 2]]
    assert await asyncio.wait_for(batch.ask(4), 5) == 40  # a later request: a new window, a new call
    assert answer.calls == [[3, 1, 2], [4]]


async def test_a_request_whose_caller_stopped_waiting_is_left_out() -> None:
    answer = Recorder()
    batch = LoopBatch(answer, lambda: 0.05)
    gone, kept = batch.ask(1), batch.ask(2)
    gone.cancel()
    assert await asyncio.wait_for(kept, 5) == 20
    assert answer.calls == [[2]]


async def test_an_error_goes_to_every_request_it_would_have_answered() -> None:
    batch = LoopBatch(Recorder(error=ConnectionError("gone")), lambda: 0.05)
    results = await asyncio.wait_for(asyncio.gather(batch.ask(1), batch.ask(2), return_exceptions=True), 5)
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]


async def test_the_call_runs_in_a_context_of_its_own_not_the_first_askers() -> None:
    answer = Recorder()
    batch = LoopBatch(answer, lambda: 0.05)

    async def ask_as(name: str, key: int) -> int:
        _caller.set(name)
        return await batch.ask(key)

    assert await asyncio.wait_for(asyncio.gather(ask_as("first", 1), ask_as("second", 2)), 5) == [10, 20]
    assert answer.contexts == ["none"]


def test_each_event_loop_has_its_own_requests() -> None:
    answer = Recorder()
    batch = LoopBatch(answer, lambda: 0.01)
    async def one(key: int) -> int:
        return await asyncio.wait_for(batch.ask(key), 5)

    for key in (1, 2):
        assert asyncio.run(one(key)) == key * 10
    assert answer.calls == [[1], [2]]


@pytest.mark.parametrize("window", [0.0, 0.02])
async def test_the_window_is_read_at_each_first_request(window: float) -> None:
    seen: list[float] = []

    def current() -> float:
        seen.append(window)
        return window

    batch = LoopBatch(Recorder(), current)
    assert await asyncio.wait_for(asyncio.gather(batch.ask(1), batch.ask(2)), 5) == [10, 20]
    assert seen == [window]
