"""The worker's run host: its loop kind, and what its shutdown releases."""

from __future__ import annotations

import pytest

from llm.testing import Reply, ToolCalls
from sessions.models import Run
from sessions.runner.host import new_run_loop, run_host, run_host_shutdown
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync
from sessions.tests.test_cancellation import mcp_time_server_pids
from sessions.tests.test_runner_mcp import agent_with_time_server

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


def test_the_run_loop_kind_follows_the_setting(settings):
    import uvloop

    settings.RUN_HOST_LOOP = "uvloop"
    loop = new_run_loop()
    assert isinstance(loop, uvloop.Loop)
    loop.close()
    settings.RUN_HOST_LOOP = "asyncio"
    loop = new_run_loop()
    assert not isinstance(loop, uvloop.Loop)
    loop.close()


def test_shutdown_terminates_pooled_stdio_servers_before_the_process_ends(world, fake_llm):
    """Celery's worker_shutdown closes the run host: the MCP pool's stdio servers are
    terminated by the pool (this process is still alive, so it is not their stdin closing);
    the loop's Redis publisher and database connections are closed."""
    before = set(mcp_time_server_pids())
    agent = agent_with_time_server.func(world, fake_llm.base_url)  # the sync function under the decorator
    fake_llm.script(ToolCalls([("time__get_current_time", {"timezone": "UTC"})]), Reply("It is noon."))
    run = post_message_sync(agent=agent, user=world.member, content="time?")
    run_host().run(execute_run(run.pk))
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    pooled = set(mcp_time_server_pids()) - before
    assert pooled, "the pool keeps the server for the next run"
    from sessions import events

    publisher = events._publishers[run_host()._loop]
    connection = publisher._connection
    assert connection is not None and connection.is_open(), "the run's events went out on it"
    from sessions.runner import pg

    database = pg._pools[run_host()._loop]
    assert database.open_connections >= 1, "the run's turns were written through it"

    assert run_host_shutdown(timeout_seconds=15) is True
    assert not pooled & set(mcp_time_server_pids())
    assert connection.writer.is_closing(), "the publisher's Redis connection was closed"
    assert database.closed and database.open_connections == 0, "the loop's database connections were closed"
    assert run_host_shutdown() is False, "already closed"
    assert run_host().run(_answer()) == 42, "a new host starts on next use"


async def _answer() -> int:
    return 42


def test_database_calls_run_on_their_own_bounded_threads(settings):
    """RUN_HOST_DB_THREADS threads named run-db_*, never more calls at once; the loop's
    default executor (host name lookups) is not one of them."""
    import asyncio
    import threading
    import time

    from sessions.runner import threads as _db

    settings.RUN_HOST_DB_THREADS = 2
    state = {"now": 0, "most": 0, "threads": set()}
    lock = threading.Lock()

    def call() -> str:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            state["threads"].add(threading.current_thread().name)
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return threading.current_thread().name

    async def main() -> tuple[list[str], str]:
        names = await asyncio.gather(*(_db.db(call)() for _ in range(8)))
        default = await asyncio.get_running_loop().run_in_executor(None, lambda: threading.current_thread().name)
        return names, default

    names, default = asyncio.run(main())
    assert state["most"] == 2 and len(state["threads"]) == 2
    assert all(name.startswith("run-db_") for name in names)
    assert not default.startswith("run-db_")

    settings.RUN_HOST_DB_THREADS = 3  # a changed setting takes effect on the next call
    state.update(now=0, most=0, threads=set())
    asyncio.run(main())
    assert state["most"] == 3
    _db.db_executor_shutdown()


def test_tuning_freezes_the_heap_and_sets_the_collector_thresholds(settings):
    import gc
    import sys

    from sessions.runner.host import tune_interpreter_for_runs

    before = (gc.get_threshold(), sys.getswitchinterval())
    settings.RUN_HOST_GC_THRESHOLDS = (12_345, 7, 9)
    settings.RUN_HOST_SWITCH_INTERVAL_MS = 2
    try:
        tune_interpreter_for_runs()
        assert gc.get_threshold() == (12_345, 7, 9)
        assert sys.getswitchinterval() == 0.002
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before[0])
        sys.setswitchinterval(before[1])


def test_a_shutdown_closes_only_the_model_clients_a_run_made():
    """A worker whose runs never called an Anthropic model does not import its SDK on the way
    out to close no client (seconds of CPU: the SDK builds its models at import; seen in a
    profile of a worker's stop). A fresh process: this one may have imported it already."""
    import os
    import subprocess
    import sys

    script = """
import sys, asyncio, django
django.setup()
from sessions.runner.host import run_host, run_host_shutdown
run_host().run(asyncio.sleep(0))
assert run_host_shutdown()
print("anthropic imported:", "llm.providers.anthropic" in sys.modules, "anthropic" in sys.modules)
"""
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "agent_platform.settings_test"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "anthropic imported: False False" in done.stdout, done.stderr[-2000:]
