"""The ``httpx2.Auth`` of an MCP connection that holds an OAuth connection
(:class:`ConnectionAuth`), and the error that says a person has to connect
(:class:`ConnectionRequired`).

The token comes from a port (``token_source``, filled by :mod:`capabilities.mcp_oauth.services`
over the database): this class keeps the last token and its expiry in memory, asks the port
again when the token is about to expire, and once more (naming the refused token, so the port
refreshes it unless another worker already has) when the server answers 401, on any request of
the connection. A second 401, or a 403 ``insufficient_scope`` (step-up: the person has to grant
more), marks the connection "connect again" with the challenged scope (the ``step_up`` port) and
raises :class:`ConnectionRequired`. No Django imports.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import httpx2
from mcp.client.auth.utils import extract_field_from_www_auth, extract_scope_from_www_auth

from capabilities.mcp.errors import McpAuthorizationRefused

EXPIRY_MARGIN_SECONDS = 30.0
"""A token this close to its expiry is refreshed before it is sent."""


class ConnectionRequired(McpAuthorizationRefused):
    """The MCP server needs a (new) OAuth connection: none was made, the refresh was refused,
    the server refused the token, or it asks for more scopes (``scope``: what it asked for).
    Raised in a pooled session's request, it ends the session and the calls in flight fail
    saying the account must be connected again (:func:`capabilities.mcp.errors.lost_call_text`)."""

    def __init__(self, message: str, *, server_id: int = 0, scope: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.server_id = server_id
        self.scope = scope


@dataclass(frozen=True, slots=True)
class AccessToken:
    """A bearer token and when it expires (``time.time()`` seconds; None: not said)."""

    token: str
    expires_at: float | None


TokenSource = Callable[[str | None], Awaitable[AccessToken]]
"""``token_source(refused)`` → a usable :class:`AccessToken`. ``refused``: the token the server
(or the clock) rejected, which must not be returned again. Raises :class:`ConnectionRequired`."""

StepUp = Callable[[str | None, str], Awaitable[None]]
"""``step_up(scope, why)``: the connection needs the person again (``why``, for them); ``scope``:
what the server's challenge asked for (None: it did not say), for the next Connect to ask for
with the scopes held."""


class ConnectionAuth(httpx2.Auth):
    """Bearer tokens of one OAuth connection on every request of one MCP connection."""

    def __init__(self, token_source: TokenSource, *, server_id: int = 0, step_up: StepUp | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._source = token_source
        self._step_up = step_up
        self._server_id = server_id
        self._clock = clock
        self._current: AccessToken | None = None

    def _usable(self) -> bool:
        current = self._current
        return current is not None and (
            current.expires_at is None or current.expires_at - EXPIRY_MARGIN_SECONDS > self._clock())

    async def _token(self, refused: str | None) -> str:
        if refused is not None or not self._usable():
            stale = refused if refused is not None else (self._current.token if self._current else None)
            self._current = await self._source(stale)
        assert self._current is not None
        return self._current.token

    async def _connect_again(self, scope: str | None, why: str) -> ConnectionRequired:
        """Record that the person has to connect again (``step_up``); the error to raise."""
        if self._step_up is not None:
            await self._step_up(scope, why)
        return ConnectionRequired(f"{why}: connect again.", server_id=self._server_id, scope=scope)

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """Send ``request`` with the connection's token; on a 401 once more with a fresh one.

        A challenge on any request counts, not only the first: a second 401 (the fresh token
        refused too; its ``WWW-Authenticate`` ``scope``, if any, is what the server wants) and a
        403 ``insufficient_scope`` both mark the connection "connect again" (``step_up``) with
        the challenged scope, and raise.

        Raises:
            ConnectionRequired: the server refused a fresh token too, or asks for more scopes.
        """
        token = await self._token(None)
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            token = await self._token(token)
            request.headers["Authorization"] = f"Bearer {token}"
            response = yield request
            if response.status_code == 401:
                scope = extract_scope_from_www_auth(response)
                raise await self._connect_again(scope, "The MCP server refused the connection's token"
                                                + (f" (it asks for {scope})" if scope else ""))
        if response.status_code == 403 and extract_field_from_www_auth(response, "error") == "insufficient_scope":
            scope = extract_scope_from_www_auth(response)
            raise await self._connect_again(scope, f"The MCP server asks for more access ({scope or 'more scopes'})")
