"""Two scheduler processes at once (as two beat processes would be, e.g. a second beat started
by mistake, or an old one not yet gone): each slot still starts exactly one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from agents.tests.factories import AgentFactory
from automations.models import Schedule, ScheduleSlot
from sessions.models import Run
from tenants.scoping import system_scope

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 12, 7, 7, 0, tzinfo=UTC)
ROUNDS = 10

SCRIPT = """
import json, os, sys, time
from datetime import datetime, timedelta
import django
django.setup()
from django.db import connection
from automations.services import schedules_tick
start = datetime.fromisoformat(sys.argv[1])
connection.ensure_connection()
print("ready", flush=True)
sys.stdin.readline()  # the parent's go, sent to both once both are ready
out = []
for n in range(int(sys.argv[2])):
    out.append(schedules_tick(now=start + timedelta(minutes=5 * n, seconds=30)))
print(json.dumps(out))
"""


@pytest.mark.django_db(transaction=True)
def test_two_scheduler_processes_start_one_run_per_slot(world):
    with system_scope():
        agent = AgentFactory(tenant=world.tenant)
        schedules = [Schedule.all_tenants.create(tenant=world.tenant, agent=agent, owner=world.member,
                                                 cron="*/5 * * * *", timezone="UTC", message=f"report {i}",
                                                 next_slot_at=START) for i in range(4)]
    db = connection.settings_dict
    queue = f"h9-schedules-test-{uuid.uuid4().hex[:8]}"  # the runs' tasks go to a queue nobody consumes
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings_test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "CELERY_QUEUE": queue, "RUNS_QUEUE": queue}
    # Both start their ticks together: each says when it is set up (Django loaded, connected), and
    # both are told to go at once. A fixed start time was missed on a slow CI machine: the late
    # process then found every slot taken and took no part.
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, START.isoformat(), str(ROUNDS)], cwd=ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == b"ready", proc.stderr.read().decode()[-3000:]
        for proc in procs:
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for proc in procs:
            proc.kill()
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
    results = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs]
    started = [sum(r["started"] for r in rounds) for rounds in results]
    assert sum(started) == 4 * ROUNDS, started
    with system_scope():
        for schedule in schedules:
            slots = list(ScheduleSlot.all_tenants.filter(schedule=schedule))
            assert len(slots) == ROUNDS == len({s.slot_time for s in slots})
            assert Run.all_tenants.filter(pk__in=[s.run_id for s in slots]).count() == ROUNDS
        assert Run.all_tenants.filter(session__agent=agent).count() == 4 * ROUNDS
    # both took part (else the test proved nothing about two at once)
    assert all(r["due"] > 0 for rounds in results for r in rounds[:1]), results
    with system_scope():
        assert Schedule.all_tenants.get(pk=schedules[0].pk).next_slot_at == START + timedelta(minutes=5 * ROUNDS)
