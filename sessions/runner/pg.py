"""The runner's per-turn statements on async psycopg connections, in the run's own event loop.

A run's model turns and tool calls each write a few rows (a message, an LLM call, tool call
updates) and read the history. Through Django's ORM these ran on threads beside the loop:
each call cost the loop a thread hop (~90 µs: a future, ``call_soon_threadsafe``, the
self-pipe), and the thread then waited for the GIL that the loop holds while it reads model
streams; with 200 runs on a loop, a run spent half its wall time queued for those threads
(bench/README.md, session 5). Here the same plain SQL runs on psycopg's
:class:`~psycopg.AsyncConnection`, awaited by the run itself: no hop, no thread.

Each event loop has a :class:`LoopPool` of at most ``RUN_HOST_PG_CONNECTIONS`` connections,
opened as needed with the connection settings of Django's ``default`` database (the test
database under pytest), in autocommit mode (a function that writes several rows wraps them in
``conn.transaction()``). Rows come back as Django's would: ``jsonb`` as its text (the callers
``json.loads`` it, as they do for Django's cursors) and times in UTC. psycopg prepares a
statement on a connection after its fifth execution (``prepare_threshold``, its default).

Why not ``psycopg_pool.AsyncConnectionPool``: it opens connections in worker tasks of its
own. ``asyncio.run`` (tests, benchmarks) cancels every task of a loop before closing it, and
a worker cancelled while connecting retries instead of ending, so the loop never closed
(seen: a test hung until its 300 s timeout). This pool has no task of its own: a connection
is opened by the run that needs it, and closed by :meth:`LoopPool.aclose`.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.string import TextLoader

from tenants import rls

APPLICATION_NAME = "agent-platform run host"
"""``application_name`` of these connections (unless the database settings set one), so that
``pg_stat_activity`` tells them from Django's."""


class PoolTimeout(psycopg.OperationalError):
    """No connection of the pool became free in time."""


class PoolClosed(psycopg.OperationalError):
    """The pool was closed (its loop is shutting down)."""


def connection_kwargs() -> dict[str, Any]:
    """libpq connection parameters of Django's ``default`` database (name, user, host, port,
    password, ``options``…), as Django's PostgreSQL backend computes them, without the
    options that only Django's own connections use (its pool, cursor class, adapters), and
    with :data:`APPLICATION_NAME` unless one is set."""
    from django.db import connection

    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context", "pool", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    params.setdefault("application_name", APPLICATION_NAME)
    return params


class LoopPool:
    """At most ``size`` async connections shared by the tasks of one event loop.

    :meth:`connection` lends one: an idle one, else a new one (opened by the caller's task),
    else it waits up to ``timeout_seconds`` for one to be given back. A lent connection runs
    as the application role in the caller's tenant scope as it is when the connection is lent
    (:func:`tenants.rls.async_sync`: a round trip only when the scope differs from the
    connection's last one); a scope entered inside the ``async with`` does not reach it. A connection given back
    in any state but idle outside a transaction (broken, closed, a statement cut off by a
    cancel) is closed instead of kept.
    """

    def __init__(self, *, size: int, timeout_seconds: float, connect_kwargs: dict[str, Any]) -> None:
        self.size = size
        self.timeout_seconds = timeout_seconds
        self._connect_kwargs = connect_kwargs
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection] = []
        self._open: set[psycopg.AsyncConnection] = set()
        self.closed = False

    @property
    def open_connections(self) -> int:
        """Connections open now (lent or idle)."""
        return len(self._open)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """Lend a connection for the ``async with`` block.

        Raises:
            PoolTimeout: none free within ``timeout_seconds``.
            PoolClosed: the pool was closed.
            psycopg.OperationalError: a new connection could not be opened.
        """
        if self.closed:
            raise PoolClosed("the run host's database pool is closed")
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await self._slots.acquire()
        except TimeoutError:
            raise PoolTimeout(
                f"no database connection became free within {self.timeout_seconds:g} s (all {self.size} in use)"
            ) from None
        conn: psycopg.AsyncConnection | None = None
        try:
            conn = self._idle.pop() if self._idle else await self._connect()
            await rls.async_sync(conn)
            yield conn
        finally:
            if conn is not None:
                await self._give_back(conn)
            self._slots.release()

    async def _connect(self) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(**self._connect_kwargs, autocommit=True)
        self._open.add(conn)
        try:
            conn.adapters.register_loader("jsonb", TextLoader)  # as Django's cursors return it
            await conn.execute("SET TIME ZONE 'UTC'")
        except BaseException:
            await self._close(conn)
            raise
        return conn

    async def _give_back(self, conn: psycopg.AsyncConnection) -> None:
        if self.closed or conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
            await self._close(conn)
        else:
            self._idle.append(conn)

    async def _close(self, conn: psycopg.AsyncConnection) -> None:
        self._open.discard(conn)
        await conn.close()  # never suspends (psycopg closes the libpq connection at once)

    async def aclose(self) -> None:
        """Close the idle connections now and lent ones as they are given back; later
        :meth:`connection` calls fail with :class:`PoolClosed`."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close(conn)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPool] = weakref.WeakKeyDictionary()
_holders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = (
    weakref.WeakKeyDictionary()
)


async def pg_pool() -> LoopPool:
    """This event loop's pool (made on the first call)."""
    from django.conf import settings

    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = LoopPool(
            size=settings.RUN_HOST_PG_CONNECTIONS, timeout_seconds=settings.RUN_HOST_PG_TIMEOUT_SECONDS,
            connect_kwargs=connection_kwargs(),
        )
        holder = _held_until_loop_shutdown(pool)
        _holders[loop] = holder
        await anext(holder)
    return pool


async def _held_until_loop_shutdown(pool: LoopPool) -> AsyncGenerator[None, None]:
    """Closes ``pool`` when it is closed: by :func:`pg_pool_aclose`, or by the loop's
    ``shutdown_asyncgens()``, which ``asyncio.run`` and ``asyncio.Runner`` (so pytest-asyncio's
    loops) call before they close a loop, so a pool never outlives its loop with open
    connections."""
    try:
        yield
    finally:
        await pool.aclose()


@asynccontextmanager
async def pg_connection() -> AsyncIterator[psycopg.AsyncConnection]:
    """A connection of this loop's pool for the ``async with`` block (autocommit; use
    ``conn.transaction()`` for several writes that belong together).

    Raises:
        PoolTimeout: no connection free within ``RUN_HOST_PG_TIMEOUT_SECONDS``.
        psycopg.Error: the database refused a statement or could not be reached.
    """
    pool = _pools.get(asyncio.get_running_loop()) or await pg_pool()
    async with pool.connection() as conn:
        yield conn


@asynccontextmanager
async def pipelined_transaction(conn: psycopg.AsyncConnection) -> AsyncIterator[None]:
    """One transaction whose statements (those the block executes on ``conn``) go to the
    server together with its ``BEGIN`` and ``COMMIT``, in one round trip (psycopg's pipeline
    mode), for statements that need no result of one another. Their cursors' results can be
    read after the block.

    Not ``conn.transaction()`` inside ``conn.pipeline()``: psycopg then waits for the server
    at the transaction's start and end, and five statements cost the loop about as much CPU
    as sent one by one (~1 ms); this way ~0.5 ms (bench/README.md, session 12).

    Raises:
        psycopg.Error: the first statement that failed; the later ones were not run and the
            transaction is rolled back, as by ``conn.transaction()`` (if even that fails, or
            the block was cut off mid-flight, the pool closes the connection instead).
    """
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            yield
            await conn.execute("COMMIT")
    except BaseException:
        if not conn.broken and conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            with contextlib.suppress(psycopg.Error):
                await conn.execute("ROLLBACK")
        raise


async def pg_pool_aclose() -> None:
    """Close this event loop's pool, if it has one (the run host's shutdown). A later
    :func:`pg_pool` makes a new one."""
    loop = asyncio.get_running_loop()
    _pools.pop(loop, None)
    holder = _holders.pop(loop, None)
    if holder is not None:
        await holder.aclose()
