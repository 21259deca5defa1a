"""The errors of an MCP connection, and how a failure is put in one line.

:class:`McpConnectError` (connecting failed) and :class:`McpConnectionLost` (the transport
ended: the pool retires the session) are :class:`~capabilities.tools.ToolError` s, so a run
shows them to the model like any tool failure; :func:`lost_call_text` is what a call hears when
its session ended under it (a refused account: connect again). :func:`describe_exception` names the first real
cause inside an exception group (the SDK's anyio task groups wrap every transport failure).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from capabilities.tools import ToolError

if TYPE_CHECKING:
    from capabilities.mcp.http_log import HttpStatusLog


class McpConnectError(ToolError):
    """Connecting to an MCP server (spawn, transport, handshake) failed or timed out.

    Raised by ``McpConnection.__aenter__``. The message names the server alias and, for stdio
    servers, ends with the last lines the server wrote to stderr.
    """

    def __init__(self, message: str, *, alias: str) -> None:
        super().__init__(message, code="mcp_connect_error")
        self.alias = alias
        """The ``McpServerConfig.alias`` of the server that could not be reached."""


class McpConnectionLost(ToolError):
    """The session's transport failed (server process exited, connection dropped, session closed).

    ``code`` is ``mcp_error``. The pool treats it as "this session is dead": it closes the
    session and reconnects on next use.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, code="mcp_error")
        self.refused: McpAuthorizationRefused | None = None
        """Set when the session ended because the server refused its account
        (:func:`lost_call_error`)."""


class McpAuthorizationRefused(Exception):  # noqa: N818 (a state the pool reports, not a bug)
    """The server refused the account a connection holds, in the middle of its session (a 401
    even after a fresh token, a 403 ``insufficient_scope``): a person has to connect the
    account again. Raised by the connection's HTTP auth (the OAuth client's
    ``capabilities.mcp_oauth.auth.ConnectionRequired`` derives from it); it ends the pooled
    session, and the calls in flight fail saying so (:func:`lost_call_text`)."""


def account_refused(exc: BaseException | None) -> McpAuthorizationRefused | None:
    """The :class:`McpAuthorizationRefused` inside ``exc`` (its exception groups, its
    ``__cause__`` chain), or None: a call that failed because the server refused the account
    (the call did not run: the server answered 401 or 403) rather than for any other reason."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for leaf in _leaf_exceptions(exc):
            if isinstance(leaf, McpAuthorizationRefused):
                return leaf
        refused = getattr(exc, "refused", None)
        if isinstance(refused, McpAuthorizationRefused):
            return refused
        exc = exc.__cause__
    return None


def lost_call_error(alias: str, failure: BaseException | None, *, started: bool) -> McpConnectionLost:
    """The :class:`McpConnectionLost` a call gets when its pooled session ended (text:
    :func:`lost_call_text`); when the server refused the account, it carries the refusal as
    ``refused`` (:func:`account_refused` finds it: the call waits for a person to connect)."""
    error = McpConnectionLost(lost_call_text(alias, failure, started=started))
    error.refused = account_refused(failure)
    return error


def lost_call_text(alias: str, failure: BaseException | None, *, started: bool) -> str:
    """What a call hears when its pooled session ended under it (``started``: the request
    went out) or before it was made, for the session's ``failure`` (None: it was closed).

    A refused account (:class:`McpAuthorizationRefused` anywhere in ``failure``) says that
    the account must be connected again (Settings → Connections); anything else is the plain
    "The connection to MCP server 'x' closed during the call." (or "…; the call was not made.").
    """
    refused = [e for e in _leaf_exceptions(failure) if isinstance(e, McpAuthorizationRefused)] if failure else []
    if refused:
        return (f"MCP server {alias!r} refused the account's access "
                f"{'during the call' if started else 'before the call was made'} ({refused[0]}). "
                "The account must be connected again: Settings → Connections in the chat app (a tenant "
                "admin connects the tenant's account); then the tool can be called again.")
    if started:
        return f"The connection to MCP server {alias!r} closed during the call."
    return f"The connection to MCP server {alias!r} closed; the call was not made."


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (itself when it is not a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaf_exceptions(inner)]
    return [exc]


def describe_exception(exc: BaseException) -> str:
    """One line naming the first real cause inside ``exc`` (unwrapping exception groups;
    cancellations skipped when something else is inside): ``"<type name>: <message>"``."""
    leaves = [e for e in _leaf_exceptions(exc) if not isinstance(e, asyncio.CancelledError)] or [exc]
    leaf = leaves[0]
    text = str(leaf) or repr(leaf)
    return f"{type(leaf).__name__}: {text}"


def connect_failure_text(failure: BaseException, http_log: HttpStatusLog | None) -> str:
    """One line for a failed connect: :func:`describe_exception` of the failure, with the HTTP
    status of the server's last error answer when it sent one (the SDK's handshake error loses
    it: a 401 with ``WWW-Authenticate`` would otherwise read like a server error)."""
    text = describe_exception(failure)
    status = http_log.describe() if http_log is not None else ""
    if status:
        text = f"{status} ({text})"
    return text
