"""Durable runs with real Celery worker processes: SIGKILL mid-run, every worker restarted
while a run waits for an approval, and one worker carrying many runs at once. The workers are subprocesses on their own queue; the
test drives the sweeper itself (Celery beat would call the same task)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Delay, Reply, ToolCalls
from sessions.models import Approval, Message, Run, ToolCall
from sessions.services import runs_sweep
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_SECONDS = 0.3
STALE_SECONDS = 1.5


class Workers:
    """Starts Celery worker processes consuming one queue of their own, against the test database."""

    def __init__(self, queue: str, log_dir: Path) -> None:
        self.queue = queue
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen] = []

    def start(self, *, concurrency: int | None = 4) -> subprocess.Popen:
        """A worker; ``concurrency`` None: the settings' default (CELERY_WORKER_CONCURRENCY)."""
        db = connection.settings_dict
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "agent_platform.settings_test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "RUNS_QUEUE": self.queue,
            "RUN_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            "RUN_STALE_SECONDS": str(STALE_SECONDS),
        }
        log = self.log_dir / f"worker-{len(self.processes)}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "sessions.tests.celery_test_app", "worker", "--pool", "threads",
             *(["--concurrency", str(concurrency)] if concurrency else []),
             "-Q", self.queue, "-l", "info", "--without-heartbeat", "--without-mingle",
             "--without-gossip", "-n", f"w{len(self.processes)}-{self.queue}@%h"],
            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.processes.append(process)
        deadline = time.monotonic() + 60
        while b"ready." not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        return process

    def kill(self, process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        os.killpg(process.pid, sig)
        process.wait(timeout=30)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                self.kill(process)


@pytest.fixture
def workers(settings, tmp_path):
    queue = f"durability-{uuid.uuid4().hex[:8]}"
    settings.RUNS_QUEUE = queue
    settings.RUN_STALE_SECONDS = STALE_SECONDS
    w = Workers(queue, tmp_path)
    yield w
    w.stop_all()
    from agent_platform.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)


def _wait_for(predicate, *, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_run_survives_sigkill_of_its_worker_and_no_tool_call_runs_twice(world, fake_llm, workers, tmp_path):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_append")
    bind_builtin(agent, "test_sleep")
    log = tmp_path / "appends.txt"
    fake_llm.script(
        ToolCalls([("test_append", {"path": str(log), "text": "a"})]),
        ToolCalls([("test_sleep", {"seconds": 2})]),
        ToolCalls([("test_append", {"path": str(log), "text": "b"})]),
        Reply("All done."),
    )
    first = workers.start()
    run = post_message_sync(agent=agent, user=world.member, content="append, sleep, append")
    _wait_for(lambda: ToolCall.all_tenants.filter(run_id=run.pk, name="test_sleep", status="running").exists(),
              what="the slow tool call to start")
    workers.kill(first)  # SIGKILL: no cleanup, the task stays unacknowledged in the broker

    killed = Run.all_tenants.get(pk=run.pk)
    assert (killed.status, killed.attempt) == ("running", 1)
    workers.start()
    time.sleep(STALE_SECONDS)
    assert runs_sweep()["resumed"] == 1  # the heartbeat went stale: hand it to a live worker
    run = _wait_for(lambda: Run.all_tenants.filter(pk=run.pk, status="completed").first(), what="the run to complete")

    assert (run.reply, run.attempt) == ("All done.", 2)
    assert log.read_text().splitlines() == ["a", "b"]  # the first append had a result: never re-run
    calls = list(ToolCall.all_tenants.filter(run_id=run.pk).order_by("id").values_list("name", "status"))
    assert calls == [("test_append", "succeeded"), ("test_sleep", "succeeded"), ("test_append", "succeeded")]
    roles = list(Message.all_tenants.filter(run_id=run.pk).order_by("position").values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    answered = list(Message.all_tenants.filter(run_id=run.pk, role="tool").values_list("tool_call_id", flat=True))
    assert len(answered) == len(set(answered)) == 3
    assert len(fake_llm.requests) == 4  # no model turn was repeated


def test_a_stale_run_that_keeps_losing_its_worker_fails_worker_lost(world, fake_llm, settings, no_enqueue):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    settings.RUN_STALE_SECONDS = 1
    Run.all_tenants.filter(pk=run.pk).update(status="running", attempt=settings.RUN_MAX_ATTEMPTS,
                                             heartbeat_at="2000-01-01T00:00:00Z")
    assert runs_sweep()["worker_lost"] == 1
    run = Run.all_tenants.get(pk=run.pk)
    assert (run.status, run.reason) == ("failed", "worker_lost")


def test_a_run_with_a_fresh_heartbeat_is_not_claimed_twice(world, fake_llm, no_enqueue):
    from sessions.runs import RunNotClaimable
    from sessions.runs.claim import _claim as run_claim
    from tenants.scoping import tenant_scope

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")
    with tenant_scope(world.tenant.pk):
        assert run_claim(run.pk).attempt == 1
        with pytest.raises(RunNotClaimable, match="held by a live worker"):
            run_claim(run.pk)  # a duplicate delivery while the first worker is alive
    assert runs_sweep()["resumed"] == 0


def approve_across_a_restart(world, workers, agent, *, content: str) -> Run:
    """Post ``content`` to ``agent`` with one worker running; once the run waits for an
    approval, stop every worker (nothing of the run stays in memory), start a new one, approve
    through the API and return the run once it has completed."""
    first = workers.start()
    run = post_message_sync(agent=agent, user=world.member, content=content)
    _wait_for(lambda: Run.all_tenants.filter(pk=run.pk, status="awaiting_approval").exists(), what="the pause")
    workers.kill(first, signal.SIGTERM)
    workers.start()
    approval = Approval.all_tenants.get(run_id=run.pk)
    resp = world.client().post(f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, format="json")
    assert resp.status_code == 200, resp.content
    return _wait_for(lambda: Run.all_tenants.filter(pk=run.pk, status="completed").first(), what="the run to complete")


def test_approval_survives_a_restart_of_every_worker(world, fake_llm, workers):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "ping"})]), Reply("The echo said ping."))
    run = approve_across_a_restart(world, workers, agent, content="Echo ping")
    assert run.reply == "The echo said ping." and run.attempt == 2
    assert ToolCall.all_tenants.get(run_id=run.pk).result == "echo: ping"


def test_one_worker_process_carries_many_runs_at_once(world, fake_llm, workers):
    """A worker started as make run starts it (threads pool, no --concurrency) works on
    more runs at once than a small thread pool would allow: every run is in flight together."""
    runs_at_once = 60  # above the 32 threads workers used to be started with
    world.tenant.max_concurrent_runs = runs_at_once
    world.tenant.save(update_fields=["max_concurrent_runs"])
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], read_timeout_seconds=60.0)
    fake_llm.respond(lambda body: Delay(4.0, Reply("ok")))
    runs = [post_message_sync(agent=agent, user=world.member, content=f"hello {i}") for i in range(runs_at_once)]
    workers.start(concurrency=None)  # the tasks wait in its queue: it takes them all at once
    _wait_for(lambda: Run.all_tenants.filter(pk__in=[r.pk for r in runs], status="completed").count() == runs_at_once,
              timeout=120, what="every run to complete")

    spans = list(Run.all_tenants.filter(pk__in=[r.pk for r in runs]).values_list("started_at", "finished_at"))
    latest_start = max(start for start, _ in spans)
    in_flight_together = sum(1 for start, end in spans if start <= latest_start < end)
    assert in_flight_together == runs_at_once
