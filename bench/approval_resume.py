"""How soon a paused run works again once a person answers (issue 37's guard: "the run resumes
within 1 s of the answer").

The platform as production runs it (``_doors.Platform``: the fake model, the web process and a
Celery worker of this benchmark's own, each its own process) and one agent with two tools: the
built-in ``test_echo`` whose binding asks for approval, and an MCP server (the tests' travel
server, 2026-07-28 over Streamable HTTP, in this process) whose ``book`` asks the user a form
(elicitation), and an MCP server that needs each user's OAuth account, not connected: its
stand-in ``ourkb__connect`` pauses the run on a Connect card (kind ``connection``). Each round
posts a message naming one tool (fake model ``named``), waits for the run to pause, answers
through the API (``POST /api/v1/approvals/<id>/``: approve, accept the form, or for the Connect
card "connected" once the bench has stored the user's connection, as the OAuth callback does
before its own answer) and measures the time from that POST's response (and from its request being sent) to the
run's next ``run_running`` event in the session's Redis stream (what the chat app's stream delivers: the worker has claimed the
run again). Then it waits for the run to end before the next round; a warm-up round of each
kind is not counted.

``.venv/bin/python bench/approval_resume.py [--rounds 20]``: prints p50 / p95 / max per kind.
The run may be claimed before the POST's response is read (the web process enqueues it on
commit), so the first figure can be near zero; the second includes the API call.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import _doors  # first of the project's modules: the environment the three processes share
import httpx
from _stats import machine, percentile

from agent_platform.redis_clients import sync_redis
from agents.models import CapabilityBinding, CapabilityKind
from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.models import McpServer
from capabilities.services import mcp_server_save
from capabilities.tests.elicit_test_server import serve_travel
from sessions.events import session_keys
from tenants.crypto import secret_encrypt
from tenants.scoping import tenant_scope

RUN_END_TYPES = {"run_completed", "run_failed", "run_cancelled"}
KINDS = {
    "approval": ('test_echo {"text": "hi"}', {"decision": "approve"}),
    "elicitation": ("travel__book {}", {"action": "accept", "content": {"city": "Oslo", "days": 2}}),
    "connection": ("ourkb__connect {}", {"decision": "approve"}),
}
"""Kind → (the message naming the tool and its arguments, the answer posted)."""


class SessionStream:
    """One chat's events as they arrive in its Redis stream (a blocking ``XREAD``)."""

    def __init__(self, chat_id: int) -> None:
        self.key = session_keys(chat_id)[1]
        self.last_id = "0-0"

    def until(self, wanted: set[str], *, run_id: int, timeout_seconds: float = 30.0) -> tuple[dict, float]:
        """The next event of ``run_id`` whose type is in ``wanted`` and ``time.perf_counter()``
        when it was read. Raises TimeoutError after ``timeout_seconds``."""
        deadline = time.perf_counter() + timeout_seconds
        while (left := deadline - time.perf_counter()) > 0:
            reply = sync_redis().xread({self.key: self.last_id}, block=max(1, int(left * 1000)), count=100)
            read_at = time.perf_counter()
            for _key, entries in reply or ():
                for entry_id, fields in entries:
                    self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    event = json.loads(fields[b"e"])
                    if event.get("run_id") == run_id and event["type"] in wanted:
                        return event, read_at
        raise TimeoutError(f"no {sorted(wanted)} of run {run_id} within {timeout_seconds:g} s")


class Accounts:
    """The bench user's OAuth connection to the ``ourkb`` server: made before a Connect card is
    answered (what the callback stores), removed after its round (the next run asks again)."""

    def __init__(self, platform: _doors.Platform, server: McpServer) -> None:
        self.platform, self.server = platform, server

    def connect(self) -> None:
        tenant = self.platform.bench.tenant
        with tenant_scope(tenant.pk):
            McpOAuthConnection.objects.create(
                tenant=tenant, server=self.server, user=self.platform.bench.user, status=ConnectionStatus.CONNECTED,
                access_token_encrypted=secret_encrypt(tenant=tenant, plaintext="bench-token"))

    def disconnect(self) -> None:
        with tenant_scope(self.platform.bench.tenant.pk):
            McpOAuthConnection.objects.filter(server=self.server).delete()


def one_round(http: httpx.Client, agent_id: int, kind: str, accounts: Accounts) -> tuple[float, float]:
    """Post, wait for the pause, answer; seconds from the answer's response to ``run_running``,
    and from the answer's request being sent (its response included) to ``run_running``."""
    message, answer = KINDS[kind]
    chat_id = http.post("/api/v1/sessions/", json={"agent": agent_id}).raise_for_status().json()["id"]
    stream = SessionStream(chat_id)
    posted = http.post(f"/api/v1/sessions/{chat_id}/messages/", json={"content": message}).raise_for_status()
    run_id = posted.json()["run"]["id"]
    paused, _ = stream.until({"run_awaiting_approval", *RUN_END_TYPES}, run_id=run_id)
    if paused["type"] != "run_awaiting_approval":
        raise RuntimeError(f"{kind}: the run ended instead of pausing: {paused}")
    [approval] = paused["data"]["approvals"]
    if kind == "connection":
        accounts.connect()
    sent = time.perf_counter()
    http.post(f"/api/v1/approvals/{approval['approval_id']}/", json=answer).raise_for_status()
    answered = time.perf_counter()
    _, resumed = stream.until({"run_running"}, run_id=run_id)
    ended, _ = stream.until(RUN_END_TYPES, run_id=run_id)
    accounts.disconnect()
    if ended["type"] != "run_completed":
        raise RuntimeError(f"{kind}: the run did not complete: {ended}")
    return resumed - answered, resumed - sent


def bind_tools(platform: _doors.Platform, travel_url: str) -> Accounts:
    """``test_echo`` asks for approval; the travel MCP server is bound too, and an OAuth one
    (per user; its address refuses connections: a resumed run leaves it out at once)."""
    bench = platform.bench
    CapabilityBinding.all_tenants.filter(agent=platform.agent).update(approval_policy=[{"pattern": "*", "action": "ask"}])
    with tenant_scope(bench.tenant.pk):
        server = mcp_server_save(tenant=bench.tenant, env=None, name="travel", alias="travel",
                                 transport="streamable_http", url=travel_url)
        CapabilityBinding.all_tenants.create(tenant=bench.tenant, agent=platform.agent,
                                             kind=CapabilityKind.MCP_SERVER, mcp_server=server)
        oauth = McpServer.objects.create(tenant=bench.tenant, name="Our knowledge", alias="ourkb",
                                         transport="streamable_http", url="http://127.0.0.1:9/mcp/",
                                         auth_mode="oauth_user")
        CapabilityBinding.all_tenants.create(tenant=bench.tenant, agent=platform.agent,
                                             kind=CapabilityKind.MCP_SERVER, mcp_server=oauth)
    return Accounts(platform, oauth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="answers per kind")
    args = parser.parse_args()
    with serve_travel() as travel_url, _doors.Platform("named", name="Resume bench") as platform:
        accounts = bind_tools(platform, travel_url)
        print(f"{machine()}; load average {os.getloadavg()[0]:.2f}; {args.rounds} answers per kind", flush=True)
        auth = {"Authorization": f"Bearer {platform.token}"}
        with httpx.Client(base_url=platform.base, headers=auth, timeout=60) as http:
            for kind in KINDS:  # warm-up: connections, the MCP session, the worker's first run
                one_round(http, platform.agent.pk, kind, accounts)
            figures: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
            for _ in range(args.rounds):
                for kind in KINDS:
                    figures[kind].append(one_round(http, platform.agent.pk, kind, accounts))
        print(f"load average after {os.getloadavg()[0]:.2f}")
        for i, what in enumerate(("answer's response → run_running", "answer sent → run_running")):
            print(f"{what} (ms)")
            for kind, pairs in figures.items():
                values = [pair[i] * 1000 for pair in pairs]
                print(f"  {kind:<12} n={len(values)} p50={percentile(values, 0.5):.1f} "
                      f"p95={percentile(values, 0.95):.1f} max={max(values):.1f}")

if __name__ == "__main__":
    main()
