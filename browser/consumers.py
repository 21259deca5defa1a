"""WebSocket ``/ws/browser/``: one socket per running Chrome extension.

Authentication: the extension offers two subprotocols, ``agent-platform.browser.v1`` and
``token.<device token>`` (never in the URL, so it stays out of access logs); the handshake
Origin must be an allowed extension (:class:`browser.routing.ExtensionOriginValidator`).
The server accepts with ``agent-platform.browser.v1``; a missing, unknown or revoked token
gets an ``error`` frame and close code 4401, a protocol version it cannot speak 4400.

After ``hello``/``welcome`` the socket registers its presence (see :mod:`browser.bridge`),
joins the device's group (revocation closes it with 4401) and resends the device's pending
commands (same idempotency keys) whose deadline has not passed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from agent_platform.redis_clients import async_redis
from browser import protocol
from browser.bridge import REPLY_TTL_SECONDS, pending_key, presence_key
from browser.services import device_group
from tenants.scoping import tenant_scope

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_PROTOCOL = 4400
HELLO_TIMEOUT_SECONDS = 10.0
SERVER_VERSION = "1"


@database_sync_to_async
def _authenticate(raw: str) -> dict[str, Any] | None:
    from browser.selectors import browser_device_authenticate
    from browser.services import browser_device_seen

    device = browser_device_authenticate(raw=raw)
    if device is None:
        return None
    with tenant_scope(device.tenant_id):
        browser_device_seen(device_id=device.pk)
    return {"id": device.pk, "name": device.name, "tenant_id": device.tenant_id, "user_id": device.user_id,
            "user": device.user.get_username(), "tenant": device.tenant.slug}


class BrowserConsumer(AsyncWebsocketConsumer):
    device: dict[str, Any] | None = None
    ready: bool = False
    hello_timer: asyncio.Task | None = None

    async def connect(self) -> None:
        offered = list(self.scope.get("subprotocols") or [])
        assert protocol.SUBPROTOCOL in offered  # browser.routing refuses other clients before us
        raw = next((p[len(protocol.TOKEN_SUBPROTOCOL_PREFIX):] for p in offered
                    if p.startswith(protocol.TOKEN_SUBPROTOCOL_PREFIX)), "")
        await self.accept(subprotocol=protocol.SUBPROTOCOL)
        self.pending: dict[str, dict[str, Any]] = {}  # command id -> {reply_key, idempotency_key, deadline}
        self.device = await _authenticate(raw) if raw else None
        if self.device is None:
            await self._fail("unauthorized", "Unknown or revoked device token: pair the extension again.",
                             CLOSE_UNAUTHENTICATED)
            return
        self.hello_timer = asyncio.create_task(self._hello_deadline())

    async def _hello_deadline(self) -> None:
        await asyncio.sleep(HELLO_TIMEOUT_SECONDS)
        if not self.ready:
            await self._fail("protocol_error", "No hello within 10 s.", CLOSE_PROTOCOL)

    async def _fail(self, code: str, message: str, close_code: int) -> None:
        await self.send(text_data=json.dumps({"type": "error", "code": code, "message": message}))
        await self.close(code=close_code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.device is None:
            return
        try:
            frame = protocol.parse_extension_frame(text_data if text_data is not None else bytes_data or b"")
        except protocol.ProtocolError as exc:
            await self.send(text_data=json.dumps({"type": "error", "code": "protocol_error", "message": str(exc)}))
            return
        except RecursionError:  # JSON nested deeper than the parser's stack: refused, the socket stays
            await self.send(text_data=json.dumps({"type": "error", "code": "protocol_error",
                                                  "message": "not JSON: nested too deeply"}))
            return
        if isinstance(frame, protocol.Hello):
            await self._on_hello(frame)
        elif not self.ready:
            await self._fail("protocol_error", "The first frame must be hello.", CLOSE_PROTOCOL)
        elif isinstance(frame, protocol.Ping):
            await self._touch_presence()
            await self.send(text_data=json.dumps({"type": "pong", "ts": frame.ts}))
        elif isinstance(frame, protocol.Result):
            await self._on_result(frame)

    async def _on_hello(self, hello: protocol.Hello) -> None:
        if protocol.PROTOCOL_VERSION not in hello.protocol_versions:
            await self._fail("unsupported_protocol",
                             f"This server speaks protocol {protocol.PROTOCOL_VERSION}; update the extension.",
                             CLOSE_PROTOCOL)
            return
        if self.ready:
            return
        self.ready = True
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        device = self.device
        assert device is not None
        if hello.extension_version:
            from browser.services import browser_device_seen

            with tenant_scope(device["tenant_id"]):
                await database_sync_to_async(browser_device_seen)(device_id=device["id"],
                                                                   extension_version=hello.extension_version)
        # Reachable before the extension hears "welcome" (it reports itself connected then).
        await self.channel_layer.group_add(device_group(device["id"]), self.channel_name)
        await self._touch_presence()
        welcome = protocol.Welcome(server_version=SERVER_VERSION, device={"id": device["id"], "name": device["name"]},
                                   user=device["user"], tenant=device["tenant"])
        await self.send(text_data=welcome.model_dump_json())
        await self._resend_pending()

    async def _touch_presence(self) -> None:
        device = self.device
        assert device is not None
        key = presence_key(device["tenant_id"], device["user_id"])
        redis = async_redis()
        await redis.hset(key, self.channel_name, json.dumps({"device_id": device["id"], "seen": time.time()}))
        await redis.expire(key, 3600)

    async def _resend_pending(self) -> None:
        device = self.device
        assert device is not None
        key = pending_key(device["tenant_id"], device["user_id"])
        redis = async_redis()
        for idem, raw in (await redis.hgetall(key)).items():
            entry = json.loads(raw)
            if entry["device_id"] != device["id"]:
                continue
            remaining_ms = int((entry["deadline"] - time.time()) * 1000)
            if remaining_ms <= 0:
                await redis.hdel(key, idem)
                continue
            await redis.rpush(entry["reply_key"], json.dumps({"kind": "reconnected"}))
            command = dict(entry["command"], deadline_ms=remaining_ms)
            self.pending[command["id"]] = entry
            await self.send(text_data=json.dumps(command))

    async def browser_command(self, message: dict[str, Any]) -> None:
        """Channel message from :func:`browser.bridge.bridge_execute`: send a command to the extension."""
        device = self.device
        if device is None or not self.ready:
            await async_redis().rpush(message["reply_key"], json.dumps({"kind": "disconnected"}))
            return
        command = protocol.Command.model_validate(message["command"]).model_dump()
        entry = {"command": command, "reply_key": message["reply_key"], "deadline": message["deadline"],
                 "device_id": device["id"]}
        await async_redis().hset(pending_key(device["tenant_id"], device["user_id"]), command["idempotency_key"],
                                 json.dumps(entry))
        self.pending[command["id"]] = entry
        await self.send(text_data=json.dumps(command))

    async def _on_result(self, frame: protocol.Result) -> None:
        entry = self.pending.pop(frame.id, None)
        if entry is None:
            return  # late answer to a command whose caller already gave up
        device = self.device
        assert device is not None
        redis = async_redis()
        await redis.hdel(pending_key(device["tenant_id"], device["user_id"]), entry["command"]["idempotency_key"])
        await redis.rpush(entry["reply_key"], json.dumps({"kind": "result", "frame": frame.model_dump()}))
        await redis.expire(entry["reply_key"], REPLY_TTL_SECONDS)

    async def browser_revoked(self, message: dict[str, Any]) -> None:
        """Channel message from :func:`browser.services.browser_device_revoke`."""
        await self._fail("revoked", "This device was revoked; pair the extension again.", CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code: int) -> None:
        if self.hello_timer is not None:
            self.hello_timer.cancel()
        device = self.device
        if device is None or not self.ready:
            return
        redis = async_redis()
        await redis.hdel(presence_key(device["tenant_id"], device["user_id"]), self.channel_name)
        await self.channel_layer.group_discard(device_group(device["id"]), self.channel_name)
        for entry in self.pending.values():
            await redis.rpush(entry["reply_key"], json.dumps({"kind": "disconnected"}))
            await redis.expire(entry["reply_key"], REPLY_TTL_SECONDS)
