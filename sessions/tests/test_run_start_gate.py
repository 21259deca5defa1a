"""How many runs a web process starts at once (``WEB_RUN_STARTS_MAX``,
sessions/api/agent_runs.py:run_start_gate): the gate itself, and the OpenAI-compatible door
starting its runs through it (their starts' ORM work competes with the loop for the GIL)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from sessions.api import agent_runs
from sessions.api.agent_runs import RunRefused, run_start_gate


async def _most_at_once(tasks: int, *, hold: float = 0.05) -> int:
    inside = most = 0

    async def start() -> None:
        nonlocal inside, most
        async with run_start_gate():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(hold)
            inside -= 1

    await asyncio.gather(*(start() for _ in range(tasks)))
    return most


@pytest.mark.parametrize(("limit", "expected"), [(2, 2), (1, 1), (0, 6)])
def test_at_most_the_limit_starts_at_once_and_all_start(settings, limit, expected):
    settings.WEB_RUN_STARTS_MAX = limit
    assert asyncio.run(_most_at_once(6)) == expected


def test_a_cancelled_waiter_leaves_the_queue_and_a_failed_start_frees_its_turn(settings):
    settings.WEB_RUN_STARTS_MAX = 1

    async def scenario() -> list[str]:
        done: list[str] = []

        async def holder() -> None:
            async with run_start_gate():
                await asyncio.sleep(0.1)
                done.append("holder")

        async def failing() -> None:
            async with run_start_gate():
                raise RuntimeError("the start failed")

        first = asyncio.create_task(holder())
        await asyncio.sleep(0.01)
        gone = asyncio.create_task(holder())  # its client goes away while it waits
        await asyncio.sleep(0.01)
        gone.cancel()
        with pytest.raises(RuntimeError):
            await failing()
        await first
        async with asyncio.timeout(1):  # neither the cancelled waiter nor the failure kept a turn
            async with run_start_gate():
                done.append("after")
        assert gone.cancelled()
        return done

    assert asyncio.run(scenario()) == ["holder", "after"]


def test_a_changed_limit_applies_on_the_same_loop(settings):
    async def scenario() -> tuple[int, int]:
        settings.WEB_RUN_STARTS_MAX = 1
        first = await _most_at_once(4)
        settings.WEB_RUN_STARTS_MAX = 3
        return first, await _most_at_once(4)

    assert asyncio.run(scenario()) == (1, 3)


class _Overlaps:
    """Counts how many threads are inside :meth:`hold` at once (the most, in ``most``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self.most = 0

    def hold(self, seconds: float) -> None:
        """Stay inside for ``seconds`` (a stand-in for a start's work)."""
        with self._lock:
            self._inside += 1
            self.most = max(self.most, self._inside)
        time.sleep(seconds)
        with self._lock:
            self._inside -= 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("all_tenants_scope")
@pytest.mark.parametrize(("limit", "overlap"), [(1, False), (0, True)])
def test_the_openai_door_starts_its_runs_through_the_gate(world, live_server_url, settings, monkeypatch, limit,
                                                          overlap):
    """Three chat completions at once: with a limit of 1 their starts (in threads) never
    overlap; with no limit they do (so the test sees the difference)."""
    settings.WEB_RUN_STARTS_MAX = limit
    overlaps = _Overlaps()

    def start(caller, slug, post):  # stands in for the ORM work of a start, then refuses
        overlaps.hold(0.3)
        raise RunRefused(404, "no such agent", code=agent_runs.AGENT_NOT_FOUND)

    monkeypatch.setattr("sessions.api.openai_compat.views.agent_run_start", start)
    client = openai.OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=world.member_token, max_retries=0,
                           timeout=30)

    def ask(_: int) -> str | None:
        try:
            client.chat.completions.create(model="helper", messages=[{"role": "user", "content": "hi"}])
        except openai.NotFoundError as exc:
            return exc.code
        return None

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(ask, range(3))) == ["model_not_found"] * 3
    assert (overlaps.most > 1) is overlap


@pytest.mark.parametrize(("name", "kwargs", "gated"), [
    ("session-messages", {"session_id": 7}, True),
    ("session-regenerate", {"session_id": 7}, True),
    ("session-continue", {"session_id": 7}, True),
    ("run-edit", {"run_id": 7}, True),
    ("run-retry", {"run_id": 7}, True),
    ("session-detail", {"session_id": 7}, False),
    ("session-events", {"session_id": 7}, False),
    ("run-cancel", {"run_id": 7}, False),
    ("approval-decide", {"approval_id": 7}, False),
])
def test_the_chat_apps_run_starting_posts_are_the_gated_paths(name, kwargs, gated):
    from django.urls import reverse

    from agent_platform.asgi import RUN_STARTING_POST

    assert bool(RUN_STARTING_POST.match(reverse(name, kwargs=kwargs))) is gated


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("all_tenants_scope")
@pytest.mark.parametrize(("limit", "overlap"), [(1, False), (0, True)])
def test_the_chat_apps_message_posts_start_through_the_gate(world, live_server_url, settings, monkeypatch, limit,
                                                            overlap):
    """Three messages posted at once through the REST API (the web process's ASGI app): with a
    limit of 1 their views (each in a thread of its own) never overlap; with no limit they do.
    Another POST (a run's cancel) is not held back by a message in the gate."""
    import httpx
    from rest_framework.response import Response

    settings.WEB_RUN_STARTS_MAX = limit
    overlaps = _Overlaps()

    def post(self, request, session_id):  # stands in for the ORM work of a message's run start
        overlaps.hold(0.3)
        return Response({"run": None}, status=201)

    monkeypatch.setattr("sessions.api.views.MessagePostApi.post", post)
    headers = {"Authorization": f"Bearer {world.member_token}"}

    def send(path: str) -> tuple[int, float]:
        """The answer's status, and when it came (monotonic seconds)."""
        status = httpx.post(f"{live_server_url}{path}", json={"content": "hi"}, headers=headers, timeout=30).status_code
        return status, time.monotonic()

    with ThreadPoolExecutor(4) as pool:
        messages = [pool.submit(send, f"/api/v1/sessions/{i}/messages/") for i in range(3)]
        time.sleep(0.1)
        cancel = pool.submit(send, "/api/v1/runs/999999/cancel/")
        answered = [m.result() for m in messages]
        cancel_status, cancel_answered = cancel.result()
    assert [status for status, _ in answered] == [201] * 3
    assert (overlaps.most > 1) is overlap
    assert cancel_status == 404
    # Held in the gate, the cancel would come after the last message (0.9 s of turns with a
    # limit of 1); a fixed bound (0.3 s) was missed by a slow CI machine even with no gate.
    assert cancel_answered < max(at for _, at in answered)
