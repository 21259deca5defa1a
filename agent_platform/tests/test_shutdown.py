"""Stopping the web process (issue 23, Shutdown): ``python -m agent_platform.web`` with an
open session WebSocket and an open SSE stream exits soon after SIGTERM or SIGINT (it ignored
both for more than 90 s), the streams told why; and a process whose exit is stuck (a thread
that never returns) is ended by the watchdog."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import websockets
from channels.db import database_sync_to_async
from django.db import connection

from agent_platform.shutdown import SHUTDOWN_EXIT_MARGIN_SECONDS
from sessions.tests.test_stream_guards import SSE, make_session

ROOT = Path(__file__).resolve().parents[2]
GRACE_SECONDS = 4
"""The grace period the tests give the web process (WEB_SHUTDOWN_GRACE_SECONDS)."""

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _database_url() -> str:
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _start_web_process(port: int, log: Path) -> subprocess.Popen:
    """The web process as ``make run`` starts it (lifespan on), against the test database."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings_test", "DATABASE_URL": _database_url(),
           "WEB_SHUTDOWN_GRACE_SECONDS": str(GRACE_SECONDS)}
    proc = subprocess.Popen([sys.executable, "-m", "agent_platform.web", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "info"],
                            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the web process exited: {log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the web process did not start within 60 s")
            time.sleep(0.2)


async def _wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return proc.poll()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_stop_signal_ends_open_streams_and_the_process_within_the_grace_period(world, signum, tmp_path):
    from conftest import free_port

    session = await database_sync_to_async(make_session)(world)
    port = free_port()
    proc = _start_web_process(port, tmp_path / "web.log")
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=20) as client:
            async with client.stream("GET", f"{base}/api/v1/sessions/{session.pk}/events",
                                     headers={"Authorization": f"Bearer {world.member_token}"}) as response:
                assert response.status_code == 200
                sse = SSE(response)
                assert (await sse.next())["retry"] == "1000"
                ws = await websockets.connect(f"ws://127.0.0.1:{port}/ws/sessions/{session.pk}/"
                                              f"?token={world.member_token}", open_timeout=20)
                await ws.send(json.dumps({"type": "ping"}))
                assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "pong"}

                started = time.monotonic()
                proc.send_signal(signum)
                assert await sse.next_event(timeout=10) == {"event": "stream_closed",
                                                            "data": {"reason": "server_stopping"}}
                assert await sse.next_event(timeout=10) is None  # the response ended
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                assert ws.close_code in (1001, 1012)
                code = await _wait_exit(proc, GRACE_SECONDS + SHUTDOWN_EXIT_MARGIN_SECONDS + 5)
                elapsed = time.monotonic() - started
        log = (tmp_path / "web.log").read_text()
        assert code is not None, f"still running {elapsed:.1f} s after {signum.name}:\n{log[-3000:]}"
        # uvicorn re-raises the signal once it has stopped: SIGTERM ends the process as the
        # signal does (-15, 143 in a shell); SIGINT raises KeyboardInterrupt (exit status 1).
        assert code in (-signum, 128 + signum, 0, 1), (code, log[-3000:])
        assert elapsed < GRACE_SECONDS, f"took {elapsed:.1f} s: the streams did not end at the signal:\n{log[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_process_stuck_in_exit_is_ended_by_the_watchdog(tmp_path):
    """A server that only notes the signal (as uvicorn's handler does) and a thread that never
    returns (interpreter exit joins it for ever): the watchdog ends the process with 128+15
    within grace + margin."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import signal, sys, threading, time
        from agent_platform import shutdown
        signal.signal(signal.SIGTERM, lambda sig, frame: None)  # the server: notes the signal only
        shutdown.install_signal_handlers(grace_seconds=1)
        threading.Thread(target=time.sleep, args=(3600,)).start()  # never returns, not a daemon
        print("ready", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=1 + SHUTDOWN_EXIT_MARGIN_SECONDS + 10)
        assert code == 128 + signal.SIGTERM
        assert time.monotonic() - started >= 1 + SHUTDOWN_EXIT_MARGIN_SECONDS - 0.5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
