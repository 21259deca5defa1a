"""More than one web process (issue 40): a web process killed in the middle of a run's stream.

Two real web processes (``python -m agent_platform.web``, as ``make run`` and the Docker image
start it) serve the same test database and Redis. A run executes on a Celery worker (the
``celery_worker`` fixture) while its answer streams slowly; a client follows the session on
process A, which is SIGKILLed after some text deltas. The client reconnects to process B with
the last ``seq`` it saw (WebSocket ``?after_seq=N``, SSE ``Last-Event-ID: N``) and reads to
``run_completed``: every event arrives exactly once, in order, across the two processes, and
the deltas add up to the whole answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import pytest
import websockets
from channels.db import database_sync_to_async
from django.db import connection

from agents.tests.factories import agent_with_route
from llm.testing import Reply
from sessions.models import Run
from sessions.services import chat_session_create
from sessions.tests.conftest import post_message, reload_run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope"),
              pytest.mark.timeout(60, func_only=True)]  # the web processes' start has its own 60 s

ROOT = Path(__file__).resolve().parents[2]
REPLY = "".join(f"w{i:02d} " for i in range(80))
"""The scripted answer: 320 characters, streamed as 80 chunks of 4."""
CHUNK_INTERVAL_SECONDS = 0.04
"""Between the model's chunks: the answer takes ~3.2 s to stream (one delta per chunk, the
runner sending at most one per 25 ms)."""
DELTAS_BEFORE_KILL = 10
"""Text deltas the client has received from process A when A is killed (~0.4 s into the answer)."""
READ_TIMEOUT_SECONDS = 20.0
"""The most one phase of reading (on A until it dies, on B until ``run_completed``) may take."""


class WebProcess:
    """``python -m agent_platform.web`` on a free port against the test database and Redis (the
    test settings; ``TEST_ISOLATION`` / ``PYTEST_XDIST_WORKER`` are inherited, so it uses this
    suite's Redis prefix). Its output goes to ``log``."""

    def __init__(self, log: Path) -> None:
        db = connection.settings_dict
        password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
        self._env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings_test",
                     "DATABASE_URL": f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
        self.log = log
        self._output = log.open("wb")
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def start(self, deadline: float, *, tries: int = 3) -> None:
        """Start it on a free port and return once it answers there; on another port if the
        port was taken meanwhile (another worker's server bound it between ``free_port()`` and
        ours: the process exits, or the port answers as someone else). Fails the test if it
        does not answer by ``deadline`` (``time.monotonic()``)."""
        from conftest import free_port, stop_process

        for _ in range(tries):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent_platform.web", "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "warning"],
                cwd=ROOT, env=self._env, stdout=self._output, stderr=subprocess.STDOUT)
            if self._answers(deadline):
                return
            stop_process(self.proc)
        pytest.fail(f"the web process did not start on a port of its own: {self.log.read_text()[-3000:]}")

    def _answers(self, deadline: float) -> bool:
        """True once this process answers as the platform (an unauthenticated ``auth/me`` is a
        401/403 of ours); False if it exited (its port was taken) or another server answers."""
        while True:
            if self.proc.poll() is not None:
                return False
            try:
                status = httpx.get(f"{self.url}/api/v1/auth/me/", timeout=2).status_code
            except httpx.HTTPError:
                status = None
            if status in (401, 403):
                return self.proc.poll() is None
            if status is not None:
                return False  # someone else's server on this port
            if time.monotonic() > deadline:
                pytest.fail(f"the web process did not start in time: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no close frame, no ``stream_closed``; the kernel drops its sockets."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (then SIGKILL after 10 s) if it still runs; close its log."""
        from conftest import stop_process

        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc)
        self._output.close()


@pytest.fixture
def web_processes(transactional_db, tmp_path) -> Iterator[tuple[WebProcess, WebProcess]]:
    """Web processes A and B, started together, listening; stopped after the test (before the
    database is emptied)."""
    pair = (WebProcess(tmp_path / "web-a.log"), WebProcess(tmp_path / "web-b.log"))
    try:
        deadline = time.monotonic() + 60
        for web in pair:
            web.start(deadline)
        yield pair
    finally:
        for web in pair:
            web.stop()


Frames = AsyncIterator[dict]
"""A stream's session frames (``{seq, type, session_id, run_id, data, ts}``), pings left out;
it ends when the connection breaks."""
Transport = Callable[[str, int, str, int | None], AbstractAsyncContextManager[Frames]]
"""Opens a stream: (base URL, session id, API token, the last ``seq`` seen or None)."""


@asynccontextmanager
async def websocket_frames(base_url: str, session_id: int, token: str, after_seq: int | None) -> AsyncIterator[Frames]:
    """Follow the session on ``ws://…/ws/sessions/<id>/?token=…[&after_seq=N]``."""
    query = f"token={token}" + (f"&after_seq={after_seq}" if after_seq is not None else "")
    url = f"{base_url.replace('http://', 'ws://')}/ws/sessions/{session_id}/?{query}"
    async with websockets.connect(url, open_timeout=20, close_timeout=2, ping_interval=None) as ws:

        async def frames() -> Frames:
            try:
                async for raw in ws:
                    frame = json.loads(raw)
                    if "seq" in frame:
                        yield frame
            except websockets.ConnectionClosedError:
                return  # the server is gone (no close frame)

        yield frames()


@asynccontextmanager
async def sse_frames(base_url: str, session_id: int, token: str, after_seq: int | None) -> AsyncIterator[Frames]:
    """Follow the session on ``GET /api/v1/sessions/<id>/events`` (Bearer token), resuming with
    ``Last-Event-ID: N`` as EventSource does."""
    headers = {"Authorization": f"Bearer {token}"}
    if after_seq is not None:
        headers["Last-Event-ID"] = str(after_seq)
    async with httpx.AsyncClient(timeout=20) as client:
        async with client.stream("GET", f"{base_url}/api/v1/sessions/{session_id}/events", headers=headers) as response:
            assert response.status_code == 200, await response.aread()

            async def frames() -> Frames:
                event: dict = {}
                try:
                    async for line in response.aiter_lines():
                        if line.startswith("id: "):
                            event["id"] = int(line[4:])
                        elif line.startswith("data: "):
                            event["data"] = json.loads(line[6:])
                        elif line == "" and "id" in event:
                            assert event["id"] == event["data"]["seq"]
                            yield event["data"]
                            event = {}
                except httpx.TransportError:
                    return  # the server is gone (the chunked body cut short)

            yield frames()


def _deltas(frames: list[dict]) -> list[str]:
    return [f["data"]["text"] for f in frames if f["type"] == "content_token"]


@database_sync_to_async
def _chat(world, base_url: str):
    agent = agent_with_route(tenant=world.tenant, base_urls=[base_url], read_timeout_seconds=60)
    with tenant_scope(world.tenant.pk):
        return chat_session_create(user=world.member, agent=agent)


async def _warm_up(web: WebProcess, session_id: int, token: str) -> None:
    """One authenticated request, so the process has loaded the app and reached the database
    before the run starts (and a misconfigured process fails here, plainly)."""
    async with httpx.AsyncClient(timeout=20) as client:
        response = await client.get(f"{web.url}/api/v1/sessions/{session_id}/",
                                    headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, (response.status_code, response.text, web.log.read_text()[-3000:])


async def follow_across_a_kill(transport: Transport, web_a: WebProcess, web_b: WebProcess, world, fake_llm):
    """Post a message whose answer streams slowly; follow the session on A from its start,
    SIGKILL A after :data:`DELTAS_BEFORE_KILL` deltas, read what A had already sent until the
    connection breaks, then follow it on B from the last ``seq`` seen to ``run_completed``.

    Returns:
        (frames from A, frames from B, the run's status when B took the client, the run id).
    """
    session = await _chat(world, fake_llm.base_url)
    token = world.member_token
    await asyncio.gather(_warm_up(web_a, session.pk, token), _warm_up(web_b, session.pk, token))
    fake_llm.script(Reply(REPLY, chunk_size=4, chunk_interval_seconds=CHUNK_INTERVAL_SECONDS))
    agent = await database_sync_to_async(lambda: session.agent)()

    from_a: list[dict] = []
    async with transport(web_a.url, session.pk, token, None) as frames:
        run = await post_message(agent=agent, user=world.member, content="stream slowly", session=session)
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            async for frame in frames:  # ends when A's connection breaks
                from_a.append(frame)
                if len(_deltas(from_a)) == DELTAS_BEFORE_KILL:
                    web_a.kill()
    assert len(_deltas(from_a)) >= DELTAS_BEFORE_KILL, "A's stream ended before the test killed it"
    assert web_a.proc.returncode == -signal.SIGKILL

    from_b: list[dict] = []
    async with transport(web_b.url, session.pk, token, from_a[-1]["seq"]) as frames:
        status_on_reconnect = (await reload_run(run.pk)).status
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            async for frame in frames:
                from_b.append(frame)
                if frame["type"] == "run_completed":
                    break
    return from_a, from_b, status_on_reconnect, run.pk


def assert_nothing_lost(from_a: list[dict], from_b: list[dict], run_id: int) -> None:
    """Every event of the session once, in order, across the two processes; the deltas are the
    whole answer; the run completed with it."""
    frames = from_a + from_b
    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(1, len(seqs) + 1)), f"gap or duplicate across the reconnect: {seqs}"
    assert frames[0]["type"] == "run_queued" and frames[-1]["type"] == "run_completed"
    assert "run_completed" not in {f["type"] for f in from_a}, "A was killed after the run had ended"
    assert _deltas(from_b), "no delta after the reconnect: the kill was not mid-stream"
    assert "".join(_deltas(from_a) + _deltas(from_b)) == REPLY
    assert frames[-1]["data"]["reply"] == REPLY
    run = Run.all_tenants.get(pk=run_id)
    assert (run.status, run.reply) == ("completed", REPLY)


@pytest.mark.parametrize("transport", [websocket_frames, sse_frames], ids=["websocket", "sse"])
async def test_a_client_of_a_killed_web_process_resumes_on_another_and_misses_nothing(
        transport, world, fake_llm, celery_worker, web_processes):
    web_a, web_b = web_processes
    from_a, from_b, status_on_reconnect, run_id = await follow_across_a_kill(
        transport, web_a, web_b, world, fake_llm)

    assert status_on_reconnect == "running", "the run had ended before the client was back"
    await database_sync_to_async(assert_nothing_lost)(from_a, from_b, run_id)
