"""A fake OAuth authorization server (token and revocation endpoints, on 127.0.0.1) and a
connected ``McpOAuthConnection`` pointing at it, for the connection tests."""

from __future__ import annotations

import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

from django.utils import timezone

from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
from capabilities.models import McpServer
from tenants.crypto import secret_encrypt


class FakeAuthorizationServer:
    """``POST /token`` (refresh-token grant: counted; ``refuse`` answers 400 ``invalid_grant``)
    and ``POST /revoke`` (RFC 7009: recorded).

    ``race_window_seconds``: how long the first refresh waits for a second one to arrive before
    answering (never, when refreshes are single-flight; without the lock all of them arrive
    within it). 0: answer at once."""

    def __init__(self, *, race_window_seconds: float = 0.0) -> None:
        self.refreshes: list[dict[str, str]] = []
        self.revocations: list[dict[str, str]] = []
        self.refuse = False
        self.down = False
        """Answer refreshes 503 (the server is having trouble, the grant is fine)."""
        self._lock = threading.Lock()
        self._second = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                form = dict(parse_qsl(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()))
                if self.path == "/revoke":
                    with fake._lock:
                        fake.revocations.append(form)
                    self._answer(200, {})
                    return
                if form.get("grant_type") != "refresh_token":
                    self._answer(400, {"error": "unsupported_grant_type"})
                    return
                with fake._lock:
                    fake.refreshes.append(form)
                    number = len(fake.refreshes)
                    if number >= 2:
                        fake._second.set()
                if fake.down:
                    self._answer(503, {"error": "temporarily_unavailable"})
                    return
                if fake.refuse:
                    self._answer(400, {"error": "invalid_grant", "error_description": "revoked"})
                    return
                if number == 1 and race_window_seconds:
                    fake._second.wait(race_window_seconds)
                self._answer(200, {"access_token": f"access-{number}", "refresh_token": f"refresh-{number}",
                                   "expires_in": 3600, "token_type": "bearer", "scope": "read"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-as", daemon=True)

    def __enter__(self) -> FakeAuthorizationServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def discovery(self, server_url: str) -> dict:
        """``McpOAuthConnection.authorization_server`` for a connection to ``server_url``."""
        return {"server_url": server_url, "resource": server_url, "scope": "read", "metadata": {
            "issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token", "revocation_endpoint": f"{self.url}/revoke"}}


def oauth_server(tenant, *, mode: str = "oauth_user", url: str = "https://mcp.example.com/mcp") -> McpServer:
    """An HTTP MCP server of ``tenant`` with OAuth (saved without the address check)."""
    return McpServer.all_tenants.create(tenant=tenant, name=f"Remote {mode}", alias=mode.replace("_", "-"),
                                        transport="streamable_http", url=url, auth_mode=mode)


def connected(server: McpServer, fake: FakeAuthorizationServer, *, user=None, expired: bool = True,
              refresh_token: str = "refresh-0") -> McpOAuthConnection:
    """A connection of ``user`` (None: the tenant's) whose access token ``access-0`` has expired
    (or expires in an hour)."""
    tenant = server.tenant
    expires = timezone.now() + (dt.timedelta(seconds=-60) if expired else dt.timedelta(hours=1))
    client = {"client_id": "platform-client", "token_endpoint_auth_method": "none", "redirect_uris": None}
    return McpOAuthConnection.all_tenants.create(
        tenant=tenant, server=server, user=user, status=ConnectionStatus.CONNECTED,
        access_token_encrypted=secret_encrypt(tenant=tenant, plaintext="access-0"),
        refresh_token_encrypted=secret_encrypt(tenant=tenant, plaintext=refresh_token) if refresh_token else "",
        expires_at=expires, scope="read", authorization_server=fake.discovery(server.url),
        client_encrypted=secret_encrypt(tenant=tenant, plaintext=json.dumps(client)),
    )
