"""The hand-off port of the run lifecycle (sessions/runs/handoff.py): runs and chats reach the
workers through the senders the app registers, with the caller's tenant, a run only once its
transaction commits; with nothing registered a hand-off raises instead of dropping the run.

The senders are recorded by a test double registered for the test (the registration the app
made is put back after it); the last test checks the app's own registration.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from sessions.runs import handoff
from tenants.scoping import tenant_scope


@pytest.fixture
def sent():
    """A recording :class:`~sessions.runs.handoff.WorkerHandOff` registered for one test."""
    before = handoff.workers()
    calls: list[tuple] = []

    def run(run_id, tenant_id=None):
        calls.append(("run", run_id, tenant_id))

    def chat_title(*, session_id, run_id, tenant_id):
        calls.append(("chat_title", session_id, run_id, tenant_id))

    handoff.workers_register(handoff.WorkerHandOff(run=run, chat_title=chat_title))
    yield calls
    handoff.workers_register(before)


def test_with_nothing_registered_a_hand_off_raises_instead_of_dropping_the_run(monkeypatch):
    monkeypatch.setattr(handoff, "_workers", None)
    with pytest.raises(RuntimeError, match="No worker hand-off is registered"):
        handoff.workers()
    with pytest.raises(RuntimeError, match="No worker hand-off is registered"):
        handoff.run_hand_off(1, 2)
    with pytest.raises(RuntimeError, match="No worker hand-off is registered"):
        handoff.chat_title_hand_off(session_id=1, run_id=2, tenant_id=3)


def test_the_registered_senders_get_the_run_and_the_chat(sent):
    handoff.run_hand_off(5, 7)
    handoff.run_hand_off(6)
    handoff.chat_title_hand_off(session_id=8, run_id=9, tenant_id=10)
    assert sent == [("run", 5, 7), ("run", 6, None), ("chat_title", 8, 9, 10)]


@pytest.mark.django_db
def test_a_run_is_handed_off_once_its_transaction_commits_with_the_callers_tenant(
    sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic(), tenant_scope(41):
            handoff.run_enqueue_on_commit(run_id=3)
            assert sent == []  # not before the commit
    assert len(callbacks) == 1
    assert sent == [("run", 3, 41)]

    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():  # no tenant in context: the worker looks it up
            handoff.run_enqueue_on_commit(run_id=4)
    assert sent[-1] == ("run", 4, None)


@pytest.mark.django_db
def test_a_rolled_back_transaction_hands_off_nothing(sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(ValueError), transaction.atomic(), tenant_scope(41):
            handoff.run_enqueue_on_commit(run_id=3)
            raise ValueError("rolled back")
    assert sent == []


async def test_runs_go_to_workers_from_the_loop_each_with_the_callers_tenant(sent):
    with tenant_scope(12):
        await handoff.runs_hand_to_workers([1, 2, 3])
    await handoff.runs_hand_to_workers([])
    assert sent == [("run", 1, 12), ("run", 2, 12), ("run", 3, 12)]


def test_the_app_registers_the_task_senders_looked_up_at_each_call(monkeypatch):
    """sessions.apps registers senders that call ``sessions.tasks``' ``run_enqueue`` and
    ``chat_title_enqueue`` as they are at the call (a test's patch applies)."""
    calls = []
    monkeypatch.setattr("sessions.tasks.run_enqueue", lambda run_id, tenant_id=None: calls.append((run_id, tenant_id)))
    monkeypatch.setattr("sessions.tasks.chat_title_enqueue", lambda **kwargs: calls.append(kwargs))
    handoff.run_hand_off(21, 22)
    handoff.chat_title_hand_off(session_id=23, run_id=24, tenant_id=25)
    assert calls == [(21, 22), {"session_id": 23, "run_id": 24, "tenant_id": 25}]
