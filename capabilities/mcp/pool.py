"""The MCP client pool: long-lived MCP sessions shared by the runs of one worker process.

One :class:`McpPool` per event loop (the worker's run-host loop, see
``sessions/runner/host.py``; :func:`mcp_pool` returns the running loop's pool). It holds one
:class:`PooledSession` per ``(tenant id, server id, config fingerprint)``: runs of the same
tenant and server share the session (no process spawn per run), an edited server (new
command, URL, env, headers or timeouts) gets a new one.

A pooled session:

- connects lazily (on first use) and, when a run binds several servers, in parallel with
  the others (the runner gathers them);
- has **one owner task** that enters and exits the SDK client (its anyio task groups must be
  entered and exited in the same task). Callers never touch the client: each call is a job
  put on the owner's queue; the owner starts the job in its own task group and the caller
  awaits a future. A cancelled caller cancels only its own job (the SDK then sends the server
  ``notifications/cancelled``); the session and other callers' calls are unaffected;
- keeps a **tool catalogue** (every page of ``tools/list``), refreshed when the server sends
  ``notifications/tools/list_changed`` (handshake-era connections: a plain notification;
  2026-07-28 connections: a ``subscriptions/listen`` stream) and when older than
  ``catalogue_ttl_seconds``; the same for its **prompts** (:attr:`PooledSession.prompts`,
  :mod:`capabilities.mcp.prompts`: ``prompts/list`` and ``notifications/prompts/list_changed``)
  and its **resources** (:attr:`PooledSession.resources`, :mod:`capabilities.mcp.resources`:
  ``resources/list`` and ``resources/templates/list``, stale on ``resources/list_changed`` and
  on ``notifications/resources/updated``; the contents of pinned resources, kept while
  subscribed: :meth:`~capabilities.mcp.resources.ResourceCache.read_kept`);
- is **evicted when idle** (no call in flight, no run holding a lease) for
  ``idle_timeout_seconds``: the owner closes it, a stdio server process is terminated;
- detects a **dead transport** (stdio process exit, dropped connection, terminated HTTP
  session): the call that hit it fails with :class:`McpConnectionLost`, the session closes,
  and the next use reconnects;
- has a **circuit breaker**: after ``breaker_failure_threshold`` consecutive failures
  (connect errors, timeouts, lost connections; not a tool's own ``isError``) it opens for
  ``breaker_cooldown_seconds``: calls fail fast with :class:`McpServerUnavailable`; then one
  half-open probe decides whether it closes again.

No Django imports except the lazy settings read in :func:`mcp_pool`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import mcp_types
from mcp import Client
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ResourceUpdated, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_platform import metrics, telemetry
from capabilities.mcp.binding_config import log_level_rank
from capabilities.mcp.call_hooks import HELD_GRACE_SECONDS, CallHooks, held_reply, only_call
from capabilities.mcp.config import McpServerConfig, check_timeout_seconds
from capabilities.mcp.elicitation import HeldCall, answer_legacy_elicitation, held_call_answer, held_call_drive
from capabilities.mcp.errors import (
    McpConnectError,
    McpConnectionLost,
    connect_failure_text,
    describe_exception,
    lost_call_error,
    lost_call_text,
)
from capabilities.mcp.http_log import HttpStatusLog
from capabilities.mcp.operations import McpToolInfo, ProgressCallback, call_tool_raw, list_all_tools
from capabilities.mcp.prompts import PromptCache
from capabilities.mcp.resources import ResourceCache, subscribable
from capabilities.mcp.transport import make_client
from capabilities.mcp.transport_end import TransportEnd
from capabilities.tools import ToolError

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_IDLE_TIMEOUT_SECONDS = 300.0
"""Setting ``MCP_POOL_IDLE_TIMEOUT_SECONDS``: a session unused this long is closed."""
DEFAULT_CATALOGUE_TTL_SECONDS = 300.0
"""Setting ``MCP_POOL_CATALOGUE_TTL_SECONDS``: a tool catalogue older than this is re-listed."""
DEFAULT_BREAKER_FAILURE_THRESHOLD = 3
"""Setting ``MCP_POOL_BREAKER_FAILURE_THRESHOLD``: consecutive failures that open the breaker."""
DEFAULT_BREAKER_COOLDOWN_SECONDS = 30.0
"""Setting ``MCP_POOL_BREAKER_COOLDOWN_SECONDS``: how long an open breaker refuses calls."""

DEFAULT_ELICITATION_WAIT_SECONDS = 24 * 3600.0
"""Setting ``APPROVAL_TTL_SECONDS``: how long a held 2025-11-25 call waits for the person."""

_CLOSE_TIMEOUT_SECONDS = 10.0
"""How long closing waits for the owner task before cancelling it (the SDK's stdio shutdown
is itself bounded at about 6.5 s: stdin close, SIGTERM, SIGKILL)."""

_LIST_CHANGED_NOTIFICATIONS: dict[type, str] = {
    mcp_types.ToolListChangedNotification: "tools",
    mcp_types.PromptListChangedNotification: "prompts",
    mcp_types.ResourceListChangedNotification: "resources",
}
"""Handshake-era ``notifications/<list>/list_changed`` → the list that changed."""
_LIST_CHANGED_EVENTS: dict[type, str] = {ToolsListChanged: "tools", PromptsListChanged: "prompts",
                                          ResourcesListChanged: "resources"}
"""2026-07-28 ``subscriptions/listen`` events → the list that changed."""

_SESSION_GONE_MESSAGES = ("Session terminated",)
"""MCPError messages (Streamable HTTP: 404 for our session id) that mean the server lost our
session, e.g. because it restarted: reconnect, like a dropped connection."""


class McpSessionExpired(McpConnectionLost):
    """A Streamable HTTP server refused our session id (HTTP 400/404 to a request that carried
    it), e.g. because it restarted: the session is retired and the call is retried once over
    a fresh handshake (:meth:`PooledSession._submit`)."""


class McpServerUnavailable(ToolError):
    """The server's circuit breaker is open: calls fail fast until the cool-down ends.

    ``code`` is ``mcp_unavailable``; the message names the server and the seconds left.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, code="mcp_unavailable")


@dataclass(frozen=True, slots=True)
class PoolKey:
    """What a pooled session is shared by."""

    tenant_id: int
    server_id: int
    """``McpServer`` primary key."""
    fingerprint: str
    """``McpServerConfig.fingerprint``: changes when the server is edited."""


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The tools a server listed (all pages)."""

    tools: tuple[McpToolInfo, ...]
    fetched_at: float
    """``time.monotonic()`` when the listing finished."""
    version: int
    """Starts at 1; +1 each time a refresh returns a different tool list."""
    skipped: tuple[str, ...] = ()
    """Malformed tools the server listed and that were left out (``"tool 'x' skipped: why"``)."""


class CircuitBreaker:
    """Consecutive-failure breaker: closed → open (cool-down) → half-open (one probe) → closed.

    Not thread-safe: used from one event loop.
    """

    def __init__(self, *, failure_threshold: int, cooldown_seconds: float, clock: Callable[[], float]) -> None:
        """Args:
        failure_threshold: Consecutive failures that open it (≥ 1).
        cooldown_seconds: Seconds it stays open before allowing one probe (positive).
        clock: Monotonic seconds (``time.monotonic`` unless a test drives time).

        Raises:
            ValueError: A bad threshold or cool-down.
        """
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold!r}")
        check_timeout_seconds(cooldown_seconds, what="cooldown_seconds")
        self.failure_threshold = failure_threshold
        self.cooldown_seconds = cooldown_seconds
        self._clock = clock
        self.failures = 0
        """Consecutive failures so far."""
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> Literal["closed", "open", "half_open"]:
        """``closed`` (normal), ``open`` (refusing) or ``half_open`` (cool-down over: one probe)."""
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at < self.cooldown_seconds:
            return "open"
        return "half_open"

    def before_attempt(self, alias: str) -> None:
        """Allow an attempt, or refuse it.

        Raises:
            McpServerUnavailable: Open, or half-open with a probe already in flight.
        """
        state = self.state
        if state == "closed":
            return
        if state == "half_open" and not self._probing:
            self._probing = True
            return
        assert self._opened_at is not None
        left = max(0.0, self.cooldown_seconds - (self._clock() - self._opened_at))
        raise McpServerUnavailable(
            f"MCP server {alias!r} is unavailable after {self.failures} consecutive failures; "
            f"it will be tried again in {left:.0f} s. Do not call its tools until then."
        )

    def record_success(self) -> None:
        """A call or connect succeeded: close the breaker."""
        self.failures = 0
        self._opened_at = None
        self._probing = False

    def record_failure(self) -> None:
        """A call or connect failed at the server/transport level: count it; maybe open."""
        self.failures += 1
        if self._probing or self.failures >= self.failure_threshold:
            self._opened_at = self._clock()
        self._probing = False


@dataclass(eq=False, slots=True)
class _Job:
    fn: Callable[[Client], Awaitable[Any]]
    future: asyncio.Future[Any]
    scope: anyio.CancelScope | None = None
    started: bool = False
    """The owner's task group began running it (the request may have gone out)."""


def _is_transport_failure(exc: BaseException) -> bool:
    """True for failures that count against the breaker (not a tool's own error)."""
    if isinstance(exc, (McpConnectionLost, McpConnectError)):
        return True
    return isinstance(exc, ToolError) and exc.code == "timeout"


class PooledSession:
    """One long-lived MCP session of a :class:`McpPool` (create it through the pool).

    Use from the pool's event loop only. Every method may be called concurrently.
    """

    holds_calls = True
    """A 2025-11-25 call whose server asks the person may be held open (``call_tool_raw``'s
    ``hold_key``)."""

    def __init__(self, pool: McpPool, key: PoolKey, config: McpServerConfig) -> None:
        self.pool = pool
        self.key = key
        self.config = config
        self.breaker = CircuitBreaker(
            failure_threshold=pool.breaker_failure_threshold,
            cooldown_seconds=pool.breaker_cooldown_seconds,
            clock=pool.clock,
        )
        self.connects = 0
        """Successful connects so far (1 + reconnects): for tests and the benchmark."""
        self.protocol_version: str | None = None
        """Negotiated protocol version of the current connection."""
        self.list_changed = asyncio.Event()
        """Set (and replaced by a fresh event) on every ``tools/list_changed`` from the server."""
        self._owner: asyncio.Task[None] | None = None
        self._jobs: asyncio.Queue[_Job | None] | None = None
        self._owned_jobs: set[_Job] = set()
        self._ready: asyncio.Future[None] | None = None
        self._client: Client | None = None
        self._transport_end = TransportEnd()
        self._accepting = False
        self._connect_timed_out = False
        self._closed = False
        self._in_flight = 0
        self._leases = 0
        self._last_used = pool.clock()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._catalogue: Catalogue | None = None
        self._changes = 0
        self._catalogue_changes = 0
        self._listing: asyncio.Task[Catalogue] | None = None
        self.http_log = HttpStatusLog()
        """HTTP error statuses of the current connection (a fresh log per connect)."""
        self.snapshot_version: int = 0
        """The catalogue version last stored in the database (set by the caller that stores it)."""
        self._holds: set[HeldCall] = set()
        """2025-11-25 calls in flight that may be held open while their server asks the person."""
        self._hooks: set[CallHooks] = set()
        """The calls in flight that keep log messages and answer sampling (:mod:`capabilities.mcp.call_hooks`)."""
        self._log_level_asked: str | None = None
        """The level last asked with ``logging/setLevel`` on this connection (handshake era)."""
        self._logging_supported = False
        """The connected server offers the ``logging`` capability."""
        self.server_capabilities: mcp_types.ServerCapabilities | None = None
        """What the server offers on the current connection (None before the first connect)."""
        self.prompts = PromptCache(self)
        """The server's prompts (``prompts/list``, cached), ``prompts/get`` and ``completion/complete``."""
        self.resources = ResourceCache(self)
        """The server's resources and templates (listings cached) and ``resources/read``."""

    # --- state ------------------------------------------------------------------------------

    @property
    def state(self) -> Literal["idle", "connecting", "ready", "closed"]:
        """``idle`` (not connected), ``connecting``, ``ready`` or ``closed`` (evicted for good)."""
        if self._closed:
            return "closed"
        if self._accepting:
            return "ready"
        if self._owner is not None and not self._owner.done() and self._ready is not None and not self._ready.done():
            return "connecting"
        return "idle"

    @property
    def transport_ended(self) -> bool:
        """True when the current connection's transport has ended (the server exited, the
        connection dropped), also with no call in flight; the next use reconnects."""
        return self._transport_end.ended

    def lease(self) -> Callable[[], None]:
        """Keep the session from idle eviction until the returned release function is called.

        A run takes a lease on each of its servers for its whole duration (released on the
        run's exit stack); releasing twice is harmless.
        """
        self._leases += 1
        self._cancel_idle_timer()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._leases -= 1
                self._touch()

        return release

    # --- connection -------------------------------------------------------------------------

    def _alive(self) -> bool:
        if not self._accepting or self._owner is None or self._owner.done():
            return False
        # The transport ended (stdio server exited, connection dropped) while no call was in
        # flight: noticing it here lets a new call reconnect instead of failing on a dead pipe.
        if self._transport_end.ended:
            self._retire("the transport closed")
            return False
        return True

    async def connect(self, *, _breaker_checked: bool = False) -> None:
        """Connect if not connected (concurrent callers share one attempt).

        Raises:
            McpConnectError: Spawn, transport or handshake failed or took longer than
                ``config.connect_timeout_seconds``.
            McpServerUnavailable: The circuit breaker is open.
            RuntimeError: The session was closed for good (evicted; ask the pool again).
        """
        if self._closed:
            raise RuntimeError(f"pooled MCP session {self.config.alias!r} is closed; ask the pool for a new one")
        if self._alive():
            return
        if self._ready is None or self._ready.done() or self._owner is None or self._owner.done():
            if not _breaker_checked:
                self.breaker.before_attempt(self.config.alias)
            self._start_owner()
        assert self._ready is not None
        await asyncio.shield(self._ready)

    def _start_owner(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        ready.add_done_callback(self._on_connect_done)
        jobs: asyncio.Queue[_Job | None] = asyncio.Queue()
        self._ready, self._jobs = ready, jobs
        self._owned_jobs = owned = set()
        self._transport_end = transport_end = TransportEnd()
        self._connect_timed_out = False
        self.http_log = HttpStatusLog()
        # A fresh context: the owner outlives the run that happened to connect it.
        owner = loop.create_task(
            self._own(ready, jobs, owned, transport_end), name=f"mcp-pool:{self.config.alias}",
            context=contextvars.Context(),
        )
        self._owner = owner
        timer = loop.call_later(self.config.connect_timeout_seconds, self._on_connect_timeout, ready, owner)
        ready.add_done_callback(lambda _f: timer.cancel())

    def _on_connect_timeout(self, ready: asyncio.Future[None], owner: asyncio.Task[None]) -> None:
        if not ready.done():
            self._connect_timed_out = True
            owner.cancel()

    def _on_connect_done(self, ready: asyncio.Future[None]) -> None:
        if ready.cancelled():
            return
        if ready.exception() is None:
            metrics.mcp_session_opened()
            self.connects += 1
            self.pool.connects += 1
            self.breaker.record_success()
            self._touch()
        else:
            self.breaker.record_failure()

    async def _own(self, ready: asyncio.Future[None], jobs: asyncio.Queue[_Job | None], owned: set[_Job],
                   transport_end: TransportEnd) -> None:
        """Owner task: open the client, run jobs in its task group until told to stop, close it."""
        cfg = self.config
        stderr = None
        failure: BaseException | None = None
        try:
            async with AsyncExitStack() as stack:
                client, stderr = make_client(cfg, stack, message_handler=self._on_message, http_log=self.http_log,
                                             elicitation_callback=self._on_elicitation,
                                             transport_end=transport_end, logging_callback=self._on_log,
                                             sampling_callback=self._on_sampling)
                client = await stack.enter_async_context(client)
                if stderr is not None:
                    stderr.close_writer()  # the child holds its own copy now
                await self._serve(client, ready, jobs)
        except asyncio.CancelledError as exc:
            failure = exc
            if not self._connect_timed_out and ready.done():
                raise  # closing: cancelled by _stop
        except Exception as exc:  # noqa: BLE001 - the session's transport failed; reported below
            failure = exc
        finally:
            self._accepting = False
            if ready.done() and not ready.cancelled() and ready.exception() is None:
                metrics.mcp_session_closed()
            if not ready.done():
                ready.set_exception(await self._connect_error(failure, stderr))
            elif failure is not None and not isinstance(failure, asyncio.CancelledError):
                logger.warning("MCP server %r: pooled session ended with an error: %s", cfg.alias, describe_exception(failure))
            self._answer_lost_jobs(jobs, owned, failure)

    async def _serve(self, client: Client, ready: asyncio.Future[None], jobs: asyncio.Queue[_Job | None]) -> None:
        """The owner's work on an entered client: run each job in the client's task group (and,
        on a 2026-07-28 connection that offers it, the tool-change subscription) until told to
        stop (a None job); calls in flight finish (``disconnect()`` bounds the wait)."""
        try:
            async with anyio.create_task_group() as tg:
                self._client = client
                self.protocol_version = client.protocol_version
                self._logging_supported = client.server_capabilities.logging is not None
                self._log_level_asked = None
                self.server_capabilities = client.server_capabilities
                listen_scope, updates_scope = anyio.CancelScope(), anyio.CancelScope()
                lists = _changing_lists(client.server_capabilities)
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS and lists:
                    tg.start_soon(self._listen_for_changes, client, listen_scope, lists)
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS and subscribable(client.server_capabilities):
                    tg.start_soon(self.resources.listen_for_updates, client, updates_scope)  # pinned resources
                self._accepting = True
                ready.set_result(None)
                while (job := await jobs.get()) is not None:
                    tg.start_soon(self._run_job, client, job)
                # Stop: no new jobs; calls in flight finish (disconnect() bounds the wait).
                self._accepting = False
                listen_scope.cancel()
                updates_scope.cancel()
        finally:
            self._accepting = False
            self._client = None

    def _answer_lost_jobs(self, jobs: asyncio.Queue[_Job | None], owned: set[_Job],
                          failure: BaseException | None = None) -> None:
        """Every job handed to an owner that ended gets an answer: :class:`McpConnectionLost`
        saying the connection closed during the call (or, for one whose task never started, that
        the call was not made); when the server refused the account (``failure`` holds
        :class:`~capabilities.mcp.errors.McpAuthorizationRefused`), that it must be connected
        again (:func:`~capabilities.mcp.errors.lost_call_text`)."""
        while not jobs.empty():
            jobs.get_nowait()
        for job in list(owned):
            if not job.future.done():
                job.future.set_exception(lost_call_error(self.config.alias, failure, started=job.started))
        owned.clear()

    async def _connect_error(self, failure: BaseException | None, stderr: Any) -> McpConnectError:
        cfg = self.config
        where = f"{cfg.alias!r} ({cfg.transport} {cfg.endpoint})"
        if self._connect_timed_out or failure is None or isinstance(failure, asyncio.CancelledError):
            message = f"Could not connect to MCP server {where}: timed out after {cfg.connect_timeout_seconds:g} s"
        else:
            message = f"Could not connect to MCP server {where}: {connect_failure_text(failure, self.http_log)}"
        if stderr is not None:
            with anyio.CancelScope(shield=True):
                tail = await stderr.tail()
            if tail:
                message += f"\nServer stderr (last lines):\n{tail}"
        error = McpConnectError(message, alias=cfg.alias)
        error.__cause__ = failure
        return error

    async def _run_job(self, client: Client, job: _Job) -> None:
        """Run one caller's job in the owner's task group; its result goes to the job's future."""
        if job.future.done():  # the caller gave up before the job started
            return
        rejections = self.http_log.session_rejections
        job.started = True
        try:
            with anyio.CancelScope() as scope:
                job.scope = scope
                try:
                    result = await job.fn(client)
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    failure = self._job_failure(exc, rejections_before=rejections)
                    if not job.future.done():
                        job.future.set_exception(failure)
                else:
                    if not job.future.done():
                        job.future.set_result(result)
        finally:
            # Unanswered: the owner's task group is ending. A session that holds an account
            # (``config.auth``) leaves the answer to the owner, which learns why once the
            # client has closed (_answer_lost_jobs: a refused account says to connect again).
            if not job.future.done() and self.config.auth is None:
                job.future.set_exception(McpConnectionLost(lost_call_text(self.config.alias, None, started=True)))

    def _job_failure(self, exc: Exception, *, rejections_before: int) -> Exception:
        """What a job's caller gets for ``exc``, retiring the session when it is dead.

        The server refused our session id during the job (more HTTP session rejections than
        ``rejections_before``: it restarted): :class:`McpSessionExpired`, and the caller retries
        once on a new session; the transport ended or the server said the session is gone:
        :class:`McpConnectionLost`; else ``exc`` itself.
        """
        http_log = self.http_log
        if http_log.session_rejections > rejections_before and not isinstance(exc, McpSessionExpired):
            # This session is dead although its transport is not.
            self._retire(f"the server refused the session id ({http_log.describe()})")
            return McpSessionExpired(
                f"MCP server {self.config.alias!r} no longer knows this session "
                f"({http_log.describe()}): {getattr(exc, 'message', None) or describe_exception(exc)}"
            )
        if isinstance(exc, McpConnectionLost) or (
            isinstance(exc, ToolError) and any(m in exc.message for m in _SESSION_GONE_MESSAGES)
        ):
            self._retire(exc.message)
            return exc if isinstance(exc, McpConnectionLost) else McpConnectionLost(exc.message)
        return exc

    def _retire(self, reason: str) -> None:
        """Stop accepting jobs and let the owner close the session (reconnect on next use)."""
        if self._accepting:
            logger.info("MCP server %r: closing the pooled session: %s", self.config.alias, reason)
        self._accepting = False
        if self._jobs is not None:
            self._jobs.put_nowait(None)

    async def _on_message(self, message: Any) -> None:
        """SDK message handler: handshake-era ``<list>/list_changed`` and transport errors."""
        changed = _LIST_CHANGED_NOTIFICATIONS.get(type(message))
        if changed is not None:
            self._mark_changed(changed)
        elif isinstance(message, mcp_types.ResourceUpdatedNotification):
            self.resources.mark_updated(message.params.uri)
        elif isinstance(message, Exception):
            logger.debug("MCP server %r: transport reported %s", self.config.alias, describe_exception(message))

    async def _on_elicitation(self, context: Any, params: Any) -> mcp_types.ElicitResult:
        """SDK elicitation callback: a 2025-11-25 server asks inside an open call. With exactly
        one holdable call in flight the request is that call's (:class:`HeldCall`: the person is
        asked); otherwise which call asks is unknown and it is declined at once."""
        asking = [h for h in self._holds if h.asked is not None and not h.asked.done()]
        if len(asking) != 1:
            return await answer_legacy_elicitation(context, params)
        return await asking[0].ask(params)

    async def _on_log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        """SDK logging callback: the message goes to the one call in flight with hooks (its
        level filter applies), else to this worker's log at DEBUG."""
        hooks = only_call(self._hooks, "a log message", self.config.alias)
        if hooks is not None:
            hooks.log(params)
        else:
            logger.debug("MCP server %r log %s: %.500s", self.config.alias, params.level, params.data)

    async def _on_sampling(self, context: Any, params: mcp_types.CreateMessageRequestParams) -> Any:
        """SDK sampling callback (2025-11-25: a request inside an open call): answered by the one
        call in flight with hooks under its binding's policy; refused when it cannot be tied to
        one call."""
        hooks = only_call(self._hooks, "a sampling request", self.config.alias)
        if hooks is None:
            return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=(
                "Sampling is answered only inside a tool call, with one call of this session in flight; refused."))
        return await hooks.answer_sampling(params)

    async def _ask_log_level(self, level: str) -> None:
        """Handshake era: ``logging/setLevel`` to ``level`` when the server offers logging and
        the connection was not asked for that level or a lower one (the session is shared, so
        the server sends the most verbose level any call wants; each call filters its own).
        A failure is logged, never raised."""
        asked = self._log_level_asked
        if not self._logging_supported or self.protocol_version in MODERN_PROTOCOL_VERSIONS or (
            asked is not None and log_level_rank(asked) <= log_level_rank(level)
        ):
            return
        self._log_level_asked = level
        try:
            await self._submit(lambda client: client.session.set_logging_level(level))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the call goes on without the server's log level
            logger.info("MCP server %r: logging/setLevel %s failed: %s", self.config.alias, level, describe_exception(exc))

    @contextlib.asynccontextmanager
    async def _hooked(self, hooks: CallHooks | None) -> AsyncIterator[None]:
        """While the block runs, ``hooks`` is a call in flight (log messages, sampling)."""
        if hooks is None:
            yield
            return
        await self._ask_log_level(hooks.log_level)
        self._hooks.add(hooks)
        try:
            yield
        finally:
            self._hooks.discard(hooks)

    async def _listen_for_changes(self, client: Client, scope: anyio.CancelScope, lists: tuple[str, ...]) -> None:
        """2026-07-28 connections: ``<list>/list_changed`` (``lists``: ``tools``, ``prompts``)
        arrives on a ``subscriptions/listen`` stream.

        A stream that was established and then lost (the server restarted or dropped it)
        marks the catalogue stale and retires the session: the next use reconnects and
        subscribes again. A server that refuses the subscription leaves the TTL in charge.
        """
        established = False
        try:
            with scope:
                async with client.listen(**{f"{name}_list_changed": True for name in lists}) as subscription:
                    established = True
                    async for event in subscription:
                        if isinstance(event, ResourceUpdated):
                            self.resources.mark_updated(event.uri)
                        else:
                            self._mark_changed(_LIST_CHANGED_EVENTS.get(type(event), "tools"))
        except Exception as exc:  # noqa: BLE001 - reported below; the TTL still refreshes the catalogue
            if not established:
                logger.info("MCP server %r: no tool-change subscription: %s", self.config.alias, describe_exception(exc))
                return
            for name in lists:
                self._mark_changed(name)
            self._retire(f"the tool-change subscription was lost: {describe_exception(exc)}")

    def _mark_changed(self, name: str) -> None:
        """The server's list ``name`` (``tools``, ``prompts``) changed: its cache is stale."""
        if name == "prompts":
            self.prompts.mark_changed()
        elif name == "resources":
            self.resources.mark_changed()
        else:
            self._mark_tools_changed()

    def _mark_tools_changed(self) -> None:
        self._changes += 1
        event, self.list_changed = self.list_changed, asyncio.Event()
        event.set()

    # --- jobs -------------------------------------------------------------------------------

    async def submit(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        """Run ``fn(client)`` on the session (connected first if needed) in its owner's task
        group, as a call does: the breaker counts it, an expired session is retried once, a
        cancelled caller cancels only this job. For the requests other modules make of the
        server (:mod:`capabilities.mcp.prompts`).

        Raises:
            McpConnectError, McpServerUnavailable, McpConnectionLost; whatever ``fn`` raises.
        """
        return await self._submit(fn)

    async def _submit(self, fn: Callable[[Client], Awaitable[T]], *, _retry_expired: bool = True) -> T:
        """Run ``fn(client)`` in the owner's task group and return its result.

        Cancelling the caller cancels only this job. When the server refused the session id
        (:class:`McpSessionExpired`: it restarted), the session is reconnected (a fresh
        handshake) and ``fn`` runs once more.
        """
        self.breaker.before_attempt(self.config.alias)
        await self.connect(_breaker_checked=True)
        job, owner = self._enqueue(fn)
        try:
            result = await job.future
        except asyncio.CancelledError:
            raise
        except McpSessionExpired as exc:
            if not _retry_expired:
                self.breaker.record_failure()
                raise
            logger.info("MCP server %r: %s; reconnecting and retrying once", self.config.alias, exc.message)
        except Exception as exc:
            if _is_transport_failure(exc):
                self.breaker.record_failure()
            else:
                self.breaker.record_success()
            raise
        else:
            self.breaker.record_success()
            return result
        finally:
            self._in_flight -= 1
            self._touch()
        # Only an expired session gets here (every other outcome returned or raised above).
        # Let the retired owner close first, so that its shutdown cannot touch the new session.
        if owner is not None and not owner.done():
            await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT_SECONDS)
        return await self._submit(fn, _retry_expired=False)

    def _enqueue(self, fn: Callable[[Client], Awaitable[T]]) -> tuple[_Job, asyncio.Task[None]]:
        """Hand ``fn`` to the owner as a job (counted in flight; the idle timer stops): the job
        (its future answers the caller; cancelling the future cancels the job) and the owner.

        Raises:
            McpConnectionLost: the session died between its handshake and this call.
        """
        jobs, owner = self._jobs, self._owner
        if jobs is None or owner is None or owner.done() or not self._accepting:
            raise McpConnectionLost(f"The connection to MCP server {self.config.alias!r} closed; the call was not made.")
        # in_caller_trace: the owner's task runs the job in the caller's trace context (MCP _meta.traceparent).
        job = _Job(fn=telemetry.in_caller_trace(fn), future=asyncio.get_running_loop().create_future())
        owned = self._owned_jobs
        owned.add(job)
        job.future.add_done_callback(lambda _f: owned.discard(job))
        job.future.add_done_callback(lambda f: job.scope.cancel() if f.cancelled() and job.scope else None)
        self._in_flight += 1
        self._cancel_idle_timer()
        jobs.put_nowait(job)
        return job, owner

    async def call_tool_raw(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout_seconds: float,
        progress: ProgressCallback | None = None,
        resume: dict[str, Any] | None = None,
        hold_key: int | None = None,
        input_answer: dict[str, Any] | None = None,
        hooks: CallHooks | None = None,
    ) -> mcp_types.CallToolResult:
        """Call one tool through the owner (connects first if needed).

        Args:
            name: The server's tool name.
            arguments: JSON-serialisable arguments.
            timeout_seconds: Bound on the call (positive); ``config.call_timeout_seconds``
                applies too (the shorter wins).
            progress: Awaited, in the caller's task and in order, for each progress
                notification the server sends for this call.
            resume: The answer to the server's earlier request for input (the retried call of
                a 2026-07-28 ``InputRequiredResult``, :mod:`capabilities.mcp.elicitation`).
            hold_key: The run's tool call (primary key): on a 2025-11-25 connection a call whose
                server asks the person inside it is held open under this key
                (:class:`HeldCall`) and ``InputForUser`` raised.
            input_answer: The person's answer to a held call's question (``protocol: "held"``):
                given to the call held here under ``hold_key``.
            hooks: The call's log sink and sampling answerer (:class:`CallHooks`): while it is
                the one call in flight with hooks, the server's log messages and 2025-11-25
                sampling requests are its (on a 2026-07-28 connection its sampling requests
                come back in its own result).

        Returns:
            The successful ``CallToolResult``.

        Raises:
            ToolError: ``mcp_tool_error`` (``isError``), ``timeout``, ``mcp_error``.
            InputForUser: The server asks the person (an elicitation).
            McpConnectionLost: The transport died during the call (the next use reconnects).
            McpConnectError: Could not connect. McpServerUnavailable: breaker open.
        """
        check_timeout_seconds(timeout_seconds, what="timeout_seconds")
        timeout = min(timeout_seconds, self.config.call_timeout_seconds)
        if hold_key is not None and input_answer is not None:
            async with self._hooked(hooks):
                return await held_call_answer(input_answer, hold_key, hooks=hooks, reply=held_reply(input_answer, hooks))
        await self.catalogue()  # the SDK validates results against listed output schemas
        async with self._hooked(hooks):
            if hold_key is not None and self.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                return await self._call_holdable(name, arguments, timeout, progress, hold_key, hooks)
            return await self._call_forwarding_progress(name, arguments, timeout, progress, resume, hooks)

    async def _call_forwarding_progress(self, name: str, arguments: dict[str, Any], timeout: float,
                                        progress: ProgressCallback | None, resume: dict[str, Any] | None,
                                        hooks: CallHooks | None) -> mcp_types.CallToolResult:
        """The call through the owner; its progress notifications are awaited in order in this
        task (never blocking the session's receive loop), each before the result returns."""
        if progress is None:
            return await self._submit(
                lambda client: call_tool_raw(client, self.config, name, arguments, timeout_seconds=timeout,
                                             http_log=self.http_log, resume=resume, hooks=hooks)
            )

        updates: asyncio.Queue[tuple[float, float | None, str | None] | None] = asyncio.Queue()

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            updates.put_nowait((done, total, message))  # never block the session's receive loop

        async def forward() -> None:
            while (update := await updates.get()) is not None:
                try:
                    await progress(*update)
                except Exception:  # noqa: BLE001 - progress is best effort
                    logger.exception("MCP server %r: progress callback failed", self.config.alias)

        forwarder = asyncio.create_task(forward())
        try:
            result = await self._submit(
                lambda client: call_tool_raw(
                    client, self.config, name, arguments, timeout_seconds=timeout, progress=on_progress,
                    http_log=self.http_log, resume=resume, hooks=hooks,
                )
            )
        except BaseException:
            forwarder.cancel()
            raise
        updates.put_nowait(None)
        await forwarder  # the updates already received are forwarded before the result returns
        return result

    async def _call_holdable(self, name: str, arguments: dict[str, Any], timeout: float,
                             progress: ProgressCallback | None, key: int,
                             hooks: CallHooks | None = None) -> mcp_types.CallToolResult:
        """A 2025-11-25 call that is held open if its server asks the person (an elicitation,
        or a sampling request to approve: ``hooks.held``; see :meth:`call_tool_raw`). Its
        progress notifications are forwarded without waiting (the call may outlive the
        caller's wait)."""
        own = hooks.elicitation_timeout_seconds if hooks is not None else None  # the binding's time to answer
        held = HeldCall(wait_seconds=self.pool.elicitation_wait_seconds, call_seconds=timeout,
                        elicitation_wait_seconds=own + HELD_GRACE_SECONDS if own is not None else None)
        held.next_round()
        if hooks is not None:
            hooks.held = held

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            if progress is not None:
                asyncio.get_running_loop().create_task(progress(done, total, message))

        held.task = asyncio.get_running_loop().create_task(self._submit(
            lambda client: call_tool_raw(client, self.config, name, arguments, timeout_seconds=timeout,
                                         progress=on_progress, http_log=self.http_log, hold=held)
        ), context=contextvars.Context())
        held.task.add_done_callback(lambda task: (self._holds.discard(held), task.cancelled() or task.exception()))
        self._holds.add(held)
        return await held_call_drive(held, key, server=self.config.alias, tool_name=name)

    # --- catalogue --------------------------------------------------------------------------

    def cached_catalogue(self) -> Catalogue | None:
        """The last catalogue, whatever its age (None before the first listing)."""
        return self._catalogue

    async def catalogue(self, *, refresh: bool = False) -> Catalogue:
        """The server's tools, listed (all pages) when missing, stale, changed or ``refresh``.

        Concurrent callers share one listing; a cancelled caller does not cancel it.

        Raises:
            ToolError: ``timeout`` / ``mcp_error`` listing; McpConnectError; McpServerUnavailable.
        """
        current = self._catalogue
        fresh = (
            current is not None
            and not refresh
            and self._catalogue_changes == self._changes
            and self.pool.clock() - current.fetched_at < self.pool.catalogue_ttl_seconds
        )
        if fresh and self._alive():
            assert current is not None
            return current
        if self._listing is None or self._listing.done():
            self._listing = asyncio.get_running_loop().create_task(self._refresh(), context=contextvars.Context())
            self._listing.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(self._listing)

    async def _refresh(self) -> Catalogue:
        changes = self._changes

        async def listing(client: Client) -> list[McpToolInfo]:
            nonlocal skipped_from
            skipped_from = len(self.http_log.skipped_tools)  # a retried listing starts over
            return await list_all_tools(client, self.config, http_log=self.http_log)

        skipped_from = 0
        tools = tuple(await self._submit(listing))
        skipped = self.http_log.skipped_tools[skipped_from:]
        previous = self._catalogue
        version = 1 if previous is None else previous.version + (previous.tools != tools)
        self._catalogue = Catalogue(tools=tools, fetched_at=self.pool.clock(), version=version,
                                    skipped=tuple(skipped))
        self._catalogue_changes = changes
        return self._catalogue

    # --- idle eviction and closing ----------------------------------------------------------

    def _cancel_idle_timer(self) -> None:
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None

    def _touch(self) -> None:
        self._last_used = self.pool.clock()
        if self._in_flight or self._leases or self._closed:
            return
        self._cancel_idle_timer()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._idle_handle = loop.call_later(self.pool.idle_timeout_seconds, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_handle = None
        if self._in_flight or self._leases or self._closed:
            return
        if self._owner is not None and not self._owner.done():
            logger.info("MCP server %r: closing the pooled session after %g s idle", self.config.alias,
                        self.pool.idle_timeout_seconds)
            asyncio.get_running_loop().create_task(self.disconnect(), context=contextvars.Context())

    async def disconnect(self) -> None:
        """Close the connection (a stdio server process is terminated); the next use reconnects.

        Waits up to ~10 s for the owner to close, then cancels it. Never raises.
        """
        self._cancel_idle_timer()
        owner = self._owner
        if owner is None:
            return
        self._retire("closing")
        with anyio.CancelScope(shield=True):
            done, _ = await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT_SECONDS)
            if not done:
                logger.warning("MCP server %r: session did not close in time; cancelling its owner", self.config.alias)
                owner.cancel()
                await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT_SECONDS)
        if self._owner is owner:
            self._owner = None

    async def aclose(self) -> None:
        """Close for good (the pool forgets the session). Never raises."""
        self._closed = True
        await self.disconnect()


def _changing_lists(caps: mcp_types.ServerCapabilities) -> tuple[str, ...]:
    """The lists (``tools``, ``prompts``, ``resources``) whose changes the server announces (``listChanged``)."""
    lists = (("tools", caps.tools), ("prompts", caps.prompts), ("resources", caps.resources))
    return tuple(name for name, cap in lists if cap and cap.list_changed)


class McpPool:
    """Pooled MCP sessions of one event loop. See the module docstring."""

    def __init__(
        self,
        *,
        idle_timeout_seconds: float = DEFAULT_IDLE_TIMEOUT_SECONDS,
        catalogue_ttl_seconds: float = DEFAULT_CATALOGUE_TTL_SECONDS,
        breaker_failure_threshold: int = DEFAULT_BREAKER_FAILURE_THRESHOLD,
        breaker_cooldown_seconds: float = DEFAULT_BREAKER_COOLDOWN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        elicitation_wait_seconds: float = DEFAULT_ELICITATION_WAIT_SECONDS,
    ) -> None:
        """Args: see the ``DEFAULT_*`` constants (seconds, positive).

        Raises:
            ValueError: A non-positive timeout or threshold.
        """
        check_timeout_seconds(idle_timeout_seconds, what="idle_timeout_seconds")
        check_timeout_seconds(catalogue_ttl_seconds, what="catalogue_ttl_seconds")
        check_timeout_seconds(breaker_cooldown_seconds, what="breaker_cooldown_seconds")
        if breaker_failure_threshold < 1:
            raise ValueError(f"breaker_failure_threshold must be >= 1, got {breaker_failure_threshold!r}")
        self.idle_timeout_seconds = idle_timeout_seconds
        self.catalogue_ttl_seconds = catalogue_ttl_seconds
        self.breaker_failure_threshold = breaker_failure_threshold
        self.breaker_cooldown_seconds = breaker_cooldown_seconds
        self.clock = clock
        self.elicitation_wait_seconds = elicitation_wait_seconds
        """How long a held 2025-11-25 call waits for the person's answer (then: decline)."""
        self.connects = 0
        """Successful connects of all sessions (spawns, for stdio servers)."""
        self._sessions: dict[PoolKey, PooledSession] = {}

    @property
    def sessions(self) -> list[PooledSession]:
        """The pooled sessions (any state but closed)."""
        return list(self._sessions.values())

    def session(self, *, tenant_id: int, server_id: int, config: McpServerConfig) -> PooledSession:
        """The pooled session for this tenant's server as configured now (created, not connected).

        Sessions of the same server under an older configuration are closed (at once if
        idle, otherwise once their calls finish and leases are released).
        """
        key = PoolKey(tenant_id=tenant_id, server_id=server_id, fingerprint=config.fingerprint)
        session = self._sessions.get(key)
        if session is None or session.state == "closed":
            session = PooledSession(self, key, config)
            self._sessions[key] = session
            for other_key, other in list(self._sessions.items()):
                if other_key != key and (other_key.tenant_id, other_key.server_id) == (tenant_id, server_id):
                    del self._sessions[other_key]
                    other._closed = True
                    if not other._in_flight and not other._leases:
                        asyncio.get_running_loop().create_task(other.aclose(), context=contextvars.Context())
                    else:
                        other._retire("the server's configuration changed")
        return session

    async def aclose(self) -> None:
        """Close every session (stdio servers are terminated). Never raises."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.aclose() for s in sessions))


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, McpPool] = weakref.WeakKeyDictionary()


def mcp_pool() -> McpPool:
    """The running event loop's pool (created on first use with the ``MCP_POOL_*`` settings).

    In a worker that is the run-host loop (one pool per process); each test's event loop
    gets its own pool (close it with ``await mcp_pool().aclose()``).

    Raises:
        RuntimeError: No running event loop.
    """
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        options: dict[str, Any] = {}
        try:
            from django.conf import settings

            for name, setting in (
                ("idle_timeout_seconds", "MCP_POOL_IDLE_TIMEOUT_SECONDS"),
                ("catalogue_ttl_seconds", "MCP_POOL_CATALOGUE_TTL_SECONDS"),
                ("breaker_failure_threshold", "MCP_POOL_BREAKER_FAILURE_THRESHOLD"),
                ("breaker_cooldown_seconds", "MCP_POOL_BREAKER_COOLDOWN_SECONDS"),
                ("elicitation_wait_seconds", "APPROVAL_TTL_SECONDS"),
            ):
                if hasattr(settings, setting):
                    options[name] = getattr(settings, setting)
        except Exception:  # noqa: BLE001 - Django not configured: defaults
            options = {}
        pool = McpPool(**options)
        _pools[loop] = pool
    return pool
