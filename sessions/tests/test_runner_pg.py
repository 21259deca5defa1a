"""The run host loop's async database pool (sessions/runner/pg.py): one per event loop,
closed when its loop ends or the run host shuts down; a bounded number of connections;
a connection left in a bad state is not lent again."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.db import connection
from psycopg.pq import TransactionStatus

from sessions.runner.pg import (
    APPLICATION_NAME,
    PoolClosed,
    PoolTimeout,
    pg_connection,
    pg_pool,
    pg_pool_aclose,
    pipelined_transaction,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _backend_pids(name: str) -> set[int]:
    """Process ids of the test database's backends with ``application_name`` ``name``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database()", [name])
        return {pid for (pid,) in cursor.fetchall()}


def _backends_left(name: str, *, besides: set[int] = frozenset(), wait_seconds: float = 5.0) -> set[int]:
    """Backends named ``name`` other than ``besides`` (those the test did not open: a worker
    thread's run host loop of an earlier test keeps its own pool), once none is left or after
    ``wait_seconds`` (a backend leaves ``pg_stat_activity`` shortly after its client closed)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        left = _backend_pids(name) - besides
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_a_loop_s_pool_is_shared_by_its_first_callers_and_closed_when_the_loop_ends() -> None:
    # Only the test's own connections count: other pools of the platform (the Celery worker
    # thread's run host loop, another process on the cluster) may hold backends of this name.
    others = _backend_pids(APPLICATION_NAME)

    async def main():
        pools = await asyncio.gather(*(pg_pool() for _ in range(5)))
        async with pg_connection() as conn:
            named = await (await conn.execute("SELECT current_setting('application_name')")).fetchone()
            await conn.execute("SET application_name = 'pg-pool-test'")
            cursor = await conn.execute("SELECT current_database(), current_setting('TimeZone')")
            row = await cursor.fetchone()
        assert named == (APPLICATION_NAME,), "told apart from Django's connections"
        return pools, row

    pools, (database, time_zone) = asyncio.run(main())
    assert len({id(p) for p in pools}) == 1, "one pool per loop"
    assert database == connection.settings_dict["NAME"], "Django's database (the test database here)"
    assert time_zone == "UTC"
    assert pools[0].closed, "asyncio.run closed it as the loop ended"
    assert not _backends_left("pg-pool-test", besides=others), "its connections are gone"
    assert not _backends_left(APPLICATION_NAME, besides=others)


def test_each_loop_has_its_own_pool() -> None:
    first = asyncio.run(pg_pool())
    second = asyncio.run(pg_pool())
    assert first is not second and first.closed and second.closed


async def test_pg_pool_aclose_closes_it_and_a_later_call_opens_a_new_one() -> None:
    pool = await pg_pool()
    await pg_pool_aclose()
    assert pool.closed
    again = await pg_pool()
    assert again is not pool and not again.closed
    await pg_pool_aclose()
    await pg_pool_aclose()  # nothing left: no error


async def test_a_failed_statement_rolls_back_its_transaction_and_the_connection_is_reused(settings) -> None:
    import psycopg

    settings.RUN_HOST_PG_CONNECTIONS = 1  # the next block gets the same connection
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with pg_connection() as conn, conn.transaction():
            failed_on = conn
            await conn.execute("CREATE TEMP TABLE t (n int)")
            await conn.execute("SELECT 1 / 0")
    async with pg_connection() as conn:
        assert conn is failed_on
        cursor = await conn.execute("SELECT to_regclass('pg_temp.t') IS NULL")
        assert (await cursor.fetchone())[0], "the table's creation was rolled back"
    await pg_pool_aclose()


async def test_a_pipelined_transaction_commits_its_statements_and_their_results_are_read_after_it(settings) -> None:
    settings.RUN_HOST_PG_CONNECTIONS = 1
    async with pg_connection() as conn:
        await conn.execute("CREATE TEMP TABLE t (n int)")
        async with pipelined_transaction(conn):
            first = await conn.execute("INSERT INTO t VALUES (1), (2) RETURNING n")
            second = await conn.execute("SELECT count(*) FROM t")
            assert conn.info.transaction_status != TransactionStatus.IDLE
        assert conn.info.transaction_status == TransactionStatus.IDLE, "committed"
        assert [r[0] for r in await first.fetchall()] == [1, 2]
        assert (await second.fetchone())[0] == 2, "the second statement saw the first's rows"
    async with pg_connection() as conn:
        cursor = await conn.execute("SELECT count(*) FROM t")
        assert (await cursor.fetchone())[0] == 2
    await pg_pool_aclose()


async def test_a_failed_statement_in_a_pipelined_transaction_rolls_it_back_and_the_connection_is_reused(
    settings,
) -> None:
    import psycopg

    settings.RUN_HOST_PG_CONNECTIONS = 1
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with pg_connection() as conn:
            failed_on = conn
            await conn.execute("CREATE TEMP TABLE t (n int)")
            async with pipelined_transaction(conn):
                await conn.execute("INSERT INTO t VALUES (1)")
                await conn.execute("SELECT 1 / 0")
                await conn.execute("INSERT INTO t VALUES (2)")
    async with pg_connection() as conn:
        assert conn is failed_on and conn.info.transaction_status == TransactionStatus.IDLE
        cursor = await conn.execute("SELECT count(*) FROM t")
        assert (await cursor.fetchone())[0] == 0, "neither insert was committed"
    await pg_pool_aclose()


async def test_at_most_the_configured_connections_are_open_and_a_caller_waits_for_one(settings) -> None:
    settings.RUN_HOST_PG_CONNECTIONS = 2
    pool = await pg_pool()
    most = 0

    async def hold() -> None:
        nonlocal most
        async with pg_connection() as conn:
            most = max(most, pool.open_connections)
            await conn.execute("SELECT pg_sleep(0.05)")

    await asyncio.gather(*(hold() for _ in range(6)))
    assert most == 2 and pool.open_connections == 2, "two opened, then reused"
    await pg_pool_aclose()
    assert pool.open_connections == 0
    with pytest.raises(PoolClosed):
        async with pool.connection():
            pass


async def test_a_caller_that_waits_too_long_gets_pool_timeout(settings) -> None:
    settings.RUN_HOST_PG_CONNECTIONS = 1
    settings.RUN_HOST_PG_TIMEOUT_SECONDS = 0.2
    async with pg_connection():
        with pytest.raises(PoolTimeout, match="within 0.2 s"):
            async with pg_connection():
                pass
    async with pg_connection() as conn:  # free again
        await conn.execute("SELECT 1")
    await pg_pool_aclose()


async def test_a_statement_cut_off_by_a_cancel_leaves_no_busy_connection(settings) -> None:
    settings.RUN_HOST_PG_CONNECTIONS = 1

    async def slow() -> None:
        async with pg_connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.3)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with pg_connection() as conn:  # the only slot is free, and what it lends works
        cursor = await conn.execute("SELECT 1")
        assert (await cursor.fetchone())[0] == 1
    assert time.monotonic() - started < 5, "the server's statement was cancelled, not waited for"
    await pg_pool_aclose()
