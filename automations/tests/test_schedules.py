"""Schedules firing: one run per slot (also with two schedulers at once), the missed-slot
policies, a start that fails records its reason, pause and resume."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from agents.tests.factories import AgentFactory
from automations.models import ChatMode, MissedPolicy, Schedule, ScheduleSlot, SlotStatus
from automations.services import schedule_save, schedules_tick
from sessions.models import ChatSession, Run
from sessions.services import chat_session_create
from tenants.scoping import system_scope, tenant_scope

EIGHT = datetime(2026, 12, 7, 7, 0, tzinfo=UTC)  # Monday 08:00 in Berlin (CET)


def _schedule(world, agent, *, next_slot_at=EIGHT, **fields) -> Schedule:
    values = dict(
        tenant=world.tenant,
        agent=agent,
        owner=world.member,
        cron="0 8 * * *",
        timezone="Europe/Berlin",
        message="Good morning: the report, please.",
        next_slot_at=next_slot_at,
    )
    values.update(fields)
    return Schedule.all_tenants.create(**values)


def _slots(schedule):
    with system_scope():
        return list(ScheduleSlot.all_tenants.filter(schedule=schedule).order_by("slot_time"))


@pytest.mark.django_db
@pytest.mark.usefixtures("no_enqueue")
class TestFire:
    def test_due_slot_starts_one_run_in_a_new_chat_each_time(self, world):
        with system_scope():
            agent = AgentFactory(tenant=world.tenant)
            schedule = _schedule(world, agent)
        assert schedules_tick(now=EIGHT + timedelta(seconds=20)) == {"due": 1, "started": 1, "failed": 0}
        assert schedules_tick(now=EIGHT + timedelta(seconds=80)) == {"due": 0, "started": 0, "failed": 0}
        assert schedules_tick(now=EIGHT + timedelta(days=1, seconds=5))["started"] == 1
        slots = _slots(schedule)
        assert [s.slot_time for s in slots] == [EIGHT, EIGHT + timedelta(days=1)]
        with system_scope():
            runs = [Run.all_tenants.get(pk=s.run_id) for s in slots]
            assert all(r.user_id == world.member.pk and r.input == schedule.message for r in runs)
            assert {r.purpose for r in runs} == {"schedule"}
            assert len({r.session_id for r in runs}) == 2
            schedule.refresh_from_db()
        assert schedule.next_slot_at == EIGHT + timedelta(days=2)

    def test_fixed_chat_gets_every_run(self, world):
        with tenant_scope(world.tenant.pk):
            agent = AgentFactory(tenant=world.tenant)
            chat = chat_session_create(user=world.member, agent=agent)
            schedule = _schedule(world, agent, chat_mode=ChatMode.FIXED, chat=chat)
        schedules_tick(now=EIGHT)
        schedules_tick(now=EIGHT + timedelta(days=1))
        with system_scope():
            assert Run.all_tenants.filter(session=chat).count() == 2
            assert ChatSession.all_tenants.filter(agent=agent).count() == 1
        assert len(_slots(schedule)) == 2

    def test_failed_start_records_the_reason_and_moves_on(self, world):
        with system_scope():
            agent = AgentFactory(tenant=world.tenant, is_active=False)
            schedule = _schedule(world, agent)
        assert schedules_tick(now=EIGHT)["failed"] == 1
        [slot] = _slots(schedule)
        assert slot.status == SlotStatus.FAILED and slot.run_id is None
        assert "not active" in slot.error
        with system_scope():
            schedule.refresh_from_db()
        assert schedule.next_slot_at == EIGHT + timedelta(days=1)

    def test_owner_who_left_the_tenant_is_a_failed_slot(self, world):
        with system_scope():
            agent = AgentFactory(tenant=world.tenant)
            schedule = _schedule(world, agent)
            world.member_membership.delete()
        assert schedules_tick(now=EIGHT)["failed"] == 1
        assert "no longer an active member" in _slots(schedule)[0].error

    def test_missed_slots_skipped_by_default(self, world):
        with system_scope():
            schedule = _schedule(world, AgentFactory(tenant=world.tenant))
        later = EIGHT + timedelta(days=3, hours=2)  # down over three slots; 10:00 on the 10th is no slot
        assert schedules_tick(now=later) == {"due": 1, "started": 0, "failed": 0}
        assert _slots(schedule) == []
        with system_scope():
            schedule.refresh_from_db()
        assert schedule.next_slot_at == EIGHT + timedelta(days=4)

    def test_missed_slots_run_once_when_asked(self, world):
        with system_scope():
            schedule = _schedule(world, AgentFactory(tenant=world.tenant), missed_policy=MissedPolicy.RUN_ONCE)
        later = EIGHT + timedelta(days=3, hours=2)
        assert schedules_tick(now=later)["started"] == 1
        assert schedules_tick(now=later + timedelta(minutes=1))["started"] == 0
        [slot] = _slots(schedule)
        assert slot.catch_up and slot.slot_time == EIGHT and slot.run_id

    def test_slot_a_few_minutes_late_still_runs(self, world):
        with system_scope():
            schedule = _schedule(world, AgentFactory(tenant=world.tenant))
        assert schedules_tick(now=EIGHT + timedelta(minutes=4))["started"] == 1
        assert not _slots(schedule)[0].catch_up

    def test_paused_schedule_does_not_fire_and_resume_starts_from_the_next_slot(self, world):
        with tenant_scope(world.tenant.pk):
            agent = AgentFactory(tenant=world.tenant)
            schedule = schedule_save(
                tenant=world.tenant, owner=world.member, agent=agent, cron="* * * * *", message="tick", paused=True
            )
            assert schedule.next_slot_at is None
        assert schedules_tick()["due"] == 0
        with tenant_scope(world.tenant.pk):
            schedule = schedule_save(
                tenant=world.tenant,
                owner=world.member,
                agent=agent,
                cron="* * * * *",
                message="tick",
                paused=False,
                schedule=schedule,
            )
        assert schedule.next_slot_at is not None and schedule.next_slot_at.second == 0


def _tick_in_thread(now, barrier, results):
    try:
        barrier.wait(timeout=10)
        results.append(schedules_tick(now=now))
    except Exception as exc:  # reported by the test
        results.append(exc)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("no_enqueue")
@pytest.mark.parametrize("policy", [MissedPolicy.SKIP, MissedPolicy.RUN_ONCE])
def test_two_schedulers_at_once_start_one_run_per_slot(world, policy):
    """Two scheduler invocations in two threads (two database connections), started together
    on the same due slots, for 20 rounds: each slot starts exactly one run."""
    with system_scope():
        agent = AgentFactory(tenant=world.tenant)
        schedules = [
            _schedule(world, agent, cron="*/5 * * * *", timezone="UTC", missed_policy=policy, next_slot_at=EIGHT)
            for _ in range(3)
        ]
    for round_ in range(20):
        now = EIGHT + timedelta(minutes=5 * round_, seconds=30)
        barrier, results = threading.Barrier(2), []
        threads = [threading.Thread(target=_tick_in_thread, args=(now, barrier, results)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not [r for r in results if isinstance(r, Exception)], results
        assert sum(r["started"] for r in results) == 3, (round_, results)
    with system_scope():
        for schedule in schedules:
            slots = _slots(schedule)
            assert len(slots) == 20 and len({s.slot_time for s in slots}) == 20
            assert Run.all_tenants.filter(pk__in=[s.run_id for s in slots]).count() == 20
        assert Run.all_tenants.filter(session__agent=agent).count() == 60
