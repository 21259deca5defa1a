"""The ``/ws/browser/`` route and its Origin rule.

Browsers always send ``Origin``; the only browser pages allowed here are the extensions
listed in ``settings.BROWSER_EXTENSION_IDS`` (``chrome-extension://<id>``). A handshake without
``Origin`` (a script, the benchmark) is let through: the device token, not a cookie,
authenticates this socket, so there is no ambient credential to hijack.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import path

from agent_platform.ws_auth import websocket_deny
from browser.consumers import BrowserConsumer
from browser.protocol import SUBPROTOCOL


class ExtensionOriginValidator:
    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origins = [v.decode("latin1") for n, v in scope.get("headers", []) if n == b"origin"]
        if origins:
            allowed = {f"chrome-extension://{i}" for i in settings.BROWSER_EXTENSION_IDS}
            if origins[0] not in allowed:
                return await websocket_deny(receive, send)
        if SUBPROTOCOL not in (scope.get("subprotocols") or []):
            return await websocket_deny(receive, send)  # not our client
        # Never cookie-authenticate this socket.
        scope = dict(scope, headers=[(n, v) for n, v in scope.get("headers", []) if n != b"cookie"])
        return await self.application(scope, receive, send)


websocket_urlpatterns = [
    path("ws/browser/", ExtensionOriginValidator(BrowserConsumer.as_asgi())),
]
