"""``/ws/browser/`` and the bridge with a scripted extension (the `websockets` client) against
the real ASGI app on uvicorn and the real Redis: authentication, origins, routing to the right
user's device, revocation, and commands resent after a reconnect."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets
from django.conf import settings

from browser.bridge import BrowserError, bridge_execute
from browser.protocol import SUBPROTOCOL
from browser.tests.conftest import off_thread, pair_device_sync, run_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

EXTENSION_ORIGIN = f"chrome-extension://{settings.BROWSER_EXTENSION_IDS[0]}"


def ws_url(live_server_url: str) -> str:
    return live_server_url.replace("http://", "ws://") + "/ws/browser/"


async def connect(live_server_url, token, *, origin=EXTENSION_ORIGIN, hello=True):
    ws = await websockets.connect(ws_url(live_server_url), subprotocols=[SUBPROTOCOL, f"token.{token}"],
                                  origin=origin)
    if hello:
        await ws.send(json.dumps({"type": "hello", "protocol_versions": [1], "extension_version": "test"}))
        welcome = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert welcome["type"] == "welcome", welcome
    return ws


async def execute(world, user, op="click", params=None, *, key="k", deadline_ms=5000):
    return await bridge_execute(tenant_id=world.tenant.pk, user_id=user.pk, op=op, params=params or {"ref": "e1"},
                                deadline_ms=deadline_ms, idempotency_key=key)


@pytest.fixture
def token(world):
    return off_thread(pair_device_sync, tenant=world.tenant, user=world.member)[1]


def test_welcome_names_the_paired_account(world, live_server_url, token):
    async def go():
        ws = await websockets.connect(ws_url(live_server_url), subprotocols=[SUBPROTOCOL, f"token.{token}"],
                                      origin=EXTENSION_ORIGIN)
        assert ws.subprotocol == SUBPROTOCOL
        await ws.send(json.dumps({"type": "hello", "protocol_versions": [1], "extension_version": "0.1.0"}))
        welcome = json.loads(await ws.recv())
        await ws.close()
        return welcome

    welcome = run_async(go)
    assert welcome["type"] == "welcome" and welcome["protocol"] == 1
    assert welcome["user"] == world.member.username and welcome["tenant"] == "acme"


def test_unknown_and_revoked_tokens_are_refused(world, live_server_url, token):
    from browser.models import BrowserDevice
    from browser.services import browser_device_revoke

    async def refused(raw):
        ws = await websockets.connect(ws_url(live_server_url), subprotocols=[SUBPROTOCOL, f"token.{raw}"],
                                      origin=EXTENSION_ORIGIN)
        frame = json.loads(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        return frame, ws.close_code

    assert run_async(lambda: refused("apd_not-a-token")) == (
        {"type": "error", "code": "unauthorized", "message": "Unknown or revoked device token: pair the extension again."},
        4401,
    )
    device = off_thread(lambda: BrowserDevice.all_tenants.get(user=world.member))
    off_thread(browser_device_revoke, device=device)
    assert run_async(lambda: refused(token))[1] == 4401


def test_revoking_closes_an_open_socket(world, live_server_url, token):
    from browser.models import BrowserDevice
    from browser.services import browser_device_revoke

    async def go():
        ws = await connect(live_server_url, token)
        device = await asyncio.to_thread(off_thread, lambda: BrowserDevice.all_tenants.get(user=world.member))
        await asyncio.to_thread(off_thread, browser_device_revoke, device=device)
        frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        return frame["code"], ws.close_code

    assert run_async(go) == ("revoked", 4401)


def test_only_allowed_extension_origins_may_connect(live_server_url, token):
    async def attempt(origin):
        try:
            ws = await connect(live_server_url, token, origin=origin)
        except websockets.InvalidStatus as exc:
            return exc.response.status_code
        await ws.close()
        return "ok"

    assert run_async(lambda: attempt("https://evil.example")) == 403
    assert run_async(lambda: attempt("chrome-extension://abcdefghijklmnopabcdefghijklmnop")) == 403
    assert run_async(lambda: attempt(EXTENSION_ORIGIN)) == "ok"


def test_commands_reach_only_the_run_users_device(world, other_world, live_server_url, token):
    async def go():
        ws = await connect(live_server_url, token)

        async def answer():
            cmd = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "result", "id": cmd["id"], "ok": True, "result": {"url": "u", "op": cmd["op"]}}))
            return cmd

        answering = asyncio.create_task(answer())
        started = time.monotonic()
        for user, w in ((world.admin, world), (other_world.member, other_world)):
            with pytest.raises(BrowserError) as info:
                await bridge_execute(tenant_id=w.tenant.pk, user_id=user.pk, op="click", params={"ref": "e1"},
                                     deadline_ms=5000, idempotency_key="x")
            assert info.value.code == "browser_not_connected"
        # A member id from the wrong tenant is no better than a wrong user.
        with pytest.raises(BrowserError):
            await bridge_execute(tenant_id=other_world.tenant.pk, user_id=world.member.pk, op="click",
                                 params={"ref": "e1"}, deadline_ms=5000, idempotency_key="y")
        refused_in = time.monotonic() - started
        result = await execute(world, world.member)
        cmd = await answering
        await ws.close()
        return refused_in, result, cmd

    refused_in, result, cmd = run_async(go)
    assert refused_in < 1.0  # "not connected" fails at once, it does not wait for a deadline
    assert result == {"url": "u", "op": "click"}
    assert cmd["type"] == "command" and cmd["deadline_ms"] == 5000 and cmd["idempotency_key"] == "k"


def test_extension_errors_become_browser_errors(world, live_server_url, token):
    async def go():
        ws = await connect(live_server_url, token)

        async def answer():
            cmd = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "result", "id": cmd["id"], "ok": False,
                                      "error": {"code": "stale_ref", "message": "Ref e1 is stale"}}))

        task = asyncio.create_task(answer())
        with pytest.raises(BrowserError) as info:
            await execute(world, world.member)
        await task
        await ws.close()
        return info.value

    error = run_async(go)
    assert (error.code, error.message) == ("stale_ref", "Ref e1 is stale")


def test_invalid_frames_are_answered_not_fatal(world, live_server_url, token):
    async def go():
        ws = await connect(live_server_url, token)
        await ws.send("{not json")
        first = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "result", "id": "1", "ok": True}))  # ok without result
        second = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "ping", "ts": 1}))
        third = json.loads(await ws.recv())
        await ws.close()
        return first, second, third

    first, second, third = run_async(go)
    assert first["code"] == second["code"] == "protocol_error"
    assert third == {"type": "pong", "ts": 1}


def test_a_command_is_resent_after_a_reconnect_with_the_same_idempotency_key(world, live_server_url, token):
    async def go():
        ws = await connect(live_server_url, token)
        call = asyncio.create_task(execute(world, world.member, key="run1.call7.click", deadline_ms=8000))
        first = json.loads(await asyncio.wait_for(ws.recv(), 5))
        await ws.close()  # the socket drops before the extension answers
        ws2 = await connect(live_server_url, token)
        again = json.loads(await asyncio.wait_for(ws2.recv(), 5))
        await ws2.send(json.dumps({"type": "result", "id": again["id"], "ok": True, "result": {"clicked": 1}}))
        result = await call
        await ws2.close()
        return first, again, result

    first, again, result = run_async(go)
    assert again["id"] == first["id"] and again["idempotency_key"] == first["idempotency_key"] == "run1.call7.click"
    assert again["deadline_ms"] < first["deadline_ms"]  # what is left of the deadline
    assert result == {"clicked": 1}


def test_a_disconnect_without_reconnect_fails_with_a_clear_code(world, live_server_url, token):
    async def go():
        ws = await connect(live_server_url, token)
        call = asyncio.create_task(execute(world, world.member, deadline_ms=1500))
        await asyncio.wait_for(ws.recv(), 5)
        await ws.close()
        with pytest.raises(BrowserError) as info:
            await call
        return info.value

    error = run_async(go)
    assert error.code == "browser_disconnected" and "browser_snapshot" in error.message


def test_a_client_without_our_subprotocol_is_refused(live_server_url):
    async def go():
        with pytest.raises(websockets.InvalidStatus) as info:
            await websockets.connect(ws_url(live_server_url), origin=EXTENSION_ORIGIN)
        return info.value.response.status_code

    assert run_async(go) == 403
