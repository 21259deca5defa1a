"""The extension's socket survives a frame of JSON nested 20,000 deep (issue 23, M3): an
``error`` frame answers it and the socket keeps working (it died with a RecursionError)."""

from __future__ import annotations

import asyncio
import json

import pytest

from browser.tests.conftest import off_thread, pair_device_sync, run_async
from browser.tests.test_consumer import connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def test_deep_json_from_the_extension_is_refused_and_the_socket_stays(world, live_server_url):
    token = off_thread(pair_device_sync, tenant=world.tenant, user=world.member)[1]

    async def go():
        ws = await connect(live_server_url, token)
        await ws.send("[" * 20_000 + "]" * 20_000)
        error = json.loads(await asyncio.wait_for(ws.recv(), 5))
        await ws.send(json.dumps({"type": "ping", "ts": 1}))
        pong = json.loads(await asyncio.wait_for(ws.recv(), 5))
        await ws.close()
        return error, pong

    error, pong = run_async(go)
    assert error["type"] == "error" and error["code"] == "protocol_error"
    assert pong == {"type": "pong", "ts": 1}
