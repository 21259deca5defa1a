"""Django's requests run their sync work in threads kept from one request to the next
(agent_platform/request_threads.py), not in a new thread per request as Django's handler
alone does (each ``Thread.start`` held the event loop until the thread ran)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.signals import request_started

from agent_platform.request_threads import RequestThreads


def test_requests_through_the_served_app_reuse_one_kept_thread():
    """Two requests one after the other: Django's sync work of both (here its
    ``request_started`` receivers) in the same kept thread; no thread started for the second."""
    from agent_platform import asgi

    seen: list[tuple[int, str]] = []

    def started(**kwargs) -> None:
        seen.append((threading.get_ident(), threading.current_thread().name))

    async def two_requests() -> tuple[list[int], int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi.application),
                                     base_url="http://127.0.0.1") as client:
            statuses = [(await client.get("/api/v1/auth/me/")).status_code]
            made = asgi.request_threads.started
            statuses.append((await client.get("/api/v1/auth/me/")).status_code)
            return statuses, asgi.request_threads.started - made

    request_started.connect(started)
    try:
        statuses, made = asyncio.run(two_requests())
    finally:
        request_started.disconnect(started)
    assert statuses == [401, 401]
    assert made == 0, "the second request found the first's thread idle"
    assert len(seen) == 2 and seen[0] == seen[1], seen
    assert seen[0][1].startswith("django-request"), seen
    assert seen[0][0] != threading.get_ident()


def test_one_request_runs_its_calls_in_one_thread_and_the_next_request_reuses_it():
    async def scenario() -> None:
        threads = RequestThreads()
        async with threads.request():
            first = await sync_to_async(threading.get_ident)()
            assert await sync_to_async(threading.get_ident)() == first
        async with threads.request():
            assert await sync_to_async(threading.get_ident)() == first
        assert threads.started == 1 and threads.idle_count() == 1

    asyncio.run(scenario())


def test_a_thread_still_running_a_gone_clients_view_is_not_given_to_the_next_request():
    """A client that went away: Django cancels the request's task, the view goes on in its
    thread. That executor is not kept, so the next request does not queue behind the view."""
    release = threading.Event()

    async def scenario() -> None:
        threads = RequestThreads()
        async with threads.request():
            busy = await sync_to_async(threading.get_ident)()
            view = asyncio.ensure_future(sync_to_async(release.wait)())
            await asyncio.sleep(0.05)
            view.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view
        assert threads.idle_count() == 0
        async with threads.request():
            other = await asyncio.wait_for(sync_to_async(threading.get_ident)(), 5)
        assert other != busy and threads.started == 2
        assert threads.idle_count() == 1

    try:
        asyncio.run(scenario())
    finally:
        release.set()


@pytest.mark.parametrize("idle_max", [0, 1])
def test_at_most_idle_max_threads_are_kept(idle_max):
    async def scenario() -> tuple[int, int]:
        threads = RequestThreads(idle_max=idle_max)
        both_inside = asyncio.Barrier(2)

        async def request() -> int:
            async with threads.request():
                ident = await sync_to_async(threading.get_ident)()
                await both_inside.wait()
                return ident

        first, second = await asyncio.gather(request(), request())
        assert first != second, "requests at once each have a thread"
        return threads.started, threads.idle_count()

    assert asyncio.run(scenario()) == (2, idle_max)
