"""The in-process Celery worker of the tests (root conftest.py) runs tasks only for a test that
holds ``celery_worker``: it outlives the test that started it, and a later test that drives a
run itself had that run claimed under it (CI, 2026-12-05: "run 412 is held by a live worker")."""

from __future__ import annotations

import time

import pytest

from agents.tests.factories import agent_with_route
from sessions.models import Run
from sessions.tests.conftest import post_message_sync

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def test_a_run_posted_by_a_test_without_the_worker_fixture_stays_queued(
    world, fake_llm, transactional_db, celery_worker_session, tasks_refused,
) -> None:
    before = len(tasks_refused)
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    run = post_message_sync(agent=agent, user=world.member, content="hi")  # its task goes to the worker's queue
    deadline = time.monotonic() + 20
    while "sessions.run_execute" not in tasks_refused[before:]:
        assert time.monotonic() < deadline, f"the worker did not refuse the task (run {Run.all_tenants.get(pk=run.pk).status})"
        time.sleep(0.05)
    fresh = Run.all_tenants.get(pk=run.pk)
    assert (fresh.status, fresh.attempt) == ("queued", 0)
    assert fake_llm.requests == []
