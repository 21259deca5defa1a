"""The web process's server options (agent_platform/web.py): WebSockets without per-message
compression, both where production starts the server (``python -m agent_platform.web``) and in
the tests' live server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from agent_platform.web import cli_args

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]


async def _extensions_negotiated(base_url: str) -> str | None:
    """Open a session socket offering permessage-deflate (the client's default, as browsers
    offer it); the server's ``Sec-WebSocket-Extensions`` answer (None: no extension).
    Unauthenticated: the socket is accepted, then closed with 4401, without a database."""
    url = base_url.replace("http://", "ws://") + "/ws/sessions/1/"
    async with connect(url, open_timeout=20) as ws:
        assert "permessage-deflate" in (ws.request.headers.get("Sec-WebSocket-Extensions") or "")
        return ws.response.headers.get("Sec-WebSocket-Extensions")


def test_cli_args_are_uvicorns_options() -> None:
    assert cli_args({"ws_per_message_deflate": False, "ws_max_size": 1024}) == [
        "--ws-per-message-deflate", "false", "--ws-max-size", "1024"]


async def test_the_live_server_does_not_compress_websocket_frames(live_server_url: str) -> None:
    assert await _extensions_negotiated(live_server_url) is None


@contextmanager
def _web_process(*args: str) -> Iterator[str]:
    from conftest import free_port, stop_process

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_platform.web", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--lifespan", "off", *args],
        cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the web process exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the web process did not start within 60 s")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


async def test_the_production_web_process_does_not_compress_websocket_frames() -> None:
    with _web_process() as base_url:
        assert await _extensions_negotiated(base_url) is None


async def test_uvicorn_options_on_the_command_line_override_ours() -> None:
    with _web_process("--ws-per-message-deflate", "true") as base_url:
        assert (await _extensions_negotiated(base_url) or "").startswith("permessage-deflate")
