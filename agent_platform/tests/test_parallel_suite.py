"""The suite on several pytest-xdist workers (docs/testing.md, "In parallel"): each worker's own
Redis keys and Celery queue, and the turns that let a ``host_exclusive`` test run alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from conftest import WorkerTurns

ROOT = Path(__file__).resolve().parents[2]
_PROBE = ("from agent_platform import settings_test as s; "
          "print(s.DATABASES['default']['TEST']['NAME'], s.REDIS_KEY_PREFIX, s.CELERY_TASK_DEFAULT_QUEUE, "
          "s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], s.CACHES['default']['KEY_PREFIX'])")


def _test_settings(**environ: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("TEST_ISOLATION", "PYTEST_XDIST_WORKER")}
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env={**base, **environ}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_each_worker_has_its_own_keys_and_queue_and_pytest_django_names_its_database():
    assert _test_settings(TEST_ISOLATION="ci", PYTEST_XDIST_WORKER="gw1") == [
        "test_agent_platform_ci", "aptest_ci_gw1", "agent_platform_test_ci_gw1", "aptest_ci_gw1:asgi",
        "aptest_ci_gw1:cache"]
    assert _test_settings(PYTEST_XDIST_WORKER="gw0") == [
        "test_agent_platform", "aptest_gw0", "agent_platform_test_gw0", "aptest_gw0:asgi", "aptest_gw0:cache"]
    assert _test_settings(TEST_ISOLATION="ci") == [
        "test_agent_platform_ci", "aptest_ci", "agent_platform_test_ci", "aptest_ci:asgi", "aptest_ci:cache"]


@pytest.mark.django_db
def test_this_suites_database_is_named_by_its_tag_and_its_worker_once():
    """pytest-django appends the worker's id to the test database's name; the settings must not
    add it too (``..._gw0_gw0``)."""
    tag, worker = os.environ.get("TEST_ISOLATION"), os.environ.get("PYTEST_XDIST_WORKER")
    expected = "test_agent_platform" + (f"_{tag}" if tag else "") + (f"_{worker}" if worker else "")
    assert connection.settings_dict["NAME"] == expected


def test_an_exclusive_turn_waits_for_the_shared_ones_and_holds_back_new_ones(tmp_path):
    """Three workers' turns (three instances: flock locks belong to an open file): the
    exclusive turn starts only after the shared turn that was running ends, and a shared turn
    asked for while the exclusive one waits starts only after it."""
    running, other, exclusive = WorkerTurns(tmp_path), WorkerTurns(tmp_path), WorkerTurns(tmp_path)
    events: list[str] = []
    release_running = threading.Event()

    def hold_shared() -> None:
        with running.shared():
            events.append("shared 1 starts")
            release_running.wait(10)
            events.append("shared 1 ends")

    def take_exclusive() -> None:
        with exclusive.exclusive():
            events.append("exclusive starts")
            time.sleep(0.2)
            events.append("exclusive ends")

    def take_shared_later() -> None:
        with other.shared():
            events.append("shared 2 starts")

    threads = [threading.Thread(target=hold_shared)]
    threads[0].start()
    _wait_for(lambda: events == ["shared 1 starts"])
    threads.append(threading.Thread(target=take_exclusive))
    threads[1].start()
    time.sleep(0.3)  # the exclusive turn now waits at the turn lock, holding the gate
    threads.append(threading.Thread(target=take_shared_later))
    threads[2].start()
    time.sleep(0.3)
    assert events == ["shared 1 starts"], "neither the exclusive nor a new shared turn started"
    release_running.set()
    for thread in threads:
        thread.join(10)
    assert events == ["shared 1 starts", "shared 1 ends", "exclusive starts", "exclusive ends", "shared 2 starts"]
    for turns in (running, other, exclusive):
        turns.close()


def test_shared_turns_run_together(tmp_path):
    first, second = WorkerTurns(tmp_path), WorkerTurns(tmp_path)
    with first.shared():
        done = threading.Event()

        def take() -> None:
            with second.shared():
                done.set()

        thread = threading.Thread(target=take)
        thread.start()
        assert done.wait(5), "a second shared turn started while the first one runs"
        thread.join(5)
    first.close()
    second.close()


def _wait_for(predicate, timeout_seconds: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
