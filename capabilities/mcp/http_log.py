"""What one connection's HTTP client saw of the server's HTTP errors (:class:`HttpStatusLog`),
and error messages that keep the status the SDK drops (:func:`http_error_message`).
"""

from __future__ import annotations

import httpx2

_SESSION_ID_HEADER = "mcp-session-id"
_STALE_SESSION_STATUSES = frozenset({400, 404})
"""HTTP statuses with which a Streamable HTTP server refuses a session id it does not know
(404 per the spec; 400 "No valid session ID provided" from the TypeScript SDK's servers)."""


class HttpStatusLog:
    """The HTTP error answers one connection's HTTP client received (an httpx2 response hook).

    The SDK turns an HTTP error into a JSON-RPC error without its status ("Server returned
    an error response"); this keeps the status so messages can say what happened (``HTTP
    401: authentication required``), and counts the answers that refused our session id
    (400/404 to a request that carried ``Mcp-Session-Id``), so the pool can tell a server
    that restarted and forgot the session from an ordinary error.
    """

    def __init__(self) -> None:
        self.last_status: int | None = None
        """The last HTTP error status (>= 400), or None."""
        self.last_www_authenticate: str = ""
        """Its ``WWW-Authenticate`` header ('' when absent)."""
        self.session_rejections = 0
        """400/404 answers so far to requests that carried a session id."""
        self.errors = 0
        """HTTP error answers so far."""
        self.skipped_tools: list[str] = []
        """``"tool 'x' skipped: why"`` for each malformed tool taken out of a ``tools/list``
        answer (:class:`ToolListFilter`), in order."""

    async def on_response(self, response: httpx2.Response) -> None:
        """httpx2 ``event_hooks["response"]`` hook: record an error status."""
        if response.status_code < 400:
            return
        self.errors += 1
        self.last_status = response.status_code
        self.last_www_authenticate = response.headers.get("www-authenticate", "")
        if response.status_code in _STALE_SESSION_STATUSES and _SESSION_ID_HEADER in response.request.headers:
            self.session_rejections += 1

    def describe(self, *, since: int = 0) -> str:
        """``HTTP <status>`` of the last error (``: authentication required`` for 401,
        ``: forbidden`` for 403), or '' when none was seen after the first ``since`` errors."""
        if self.last_status is None or self.errors <= since:
            return ""
        what = {401: ": authentication required", 403: ": forbidden"}.get(self.last_status, "")
        return f"HTTP {self.last_status}{what}"


def http_error_message(message: str, http_log: HttpStatusLog | None, *, since: int = 0) -> str:
    """``message`` (an SDK error's) with the HTTP status the SDK dropped, when one was seen
    (after the log's first ``since`` errors): the SDK's stand-in "Server returned an error
    response" is replaced by it, other messages get it appended."""
    status = http_log.describe(since=since) if http_log is not None else ""
    if not status:
        return message
    if message in ("Server returned an error response", "Not Found", ""):
        return status
    return f"{message} ({status})"
