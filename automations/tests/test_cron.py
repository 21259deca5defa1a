"""Cron slots on a zone's wall clock: daylight-saving transitions (Europe/Berlin, 2026: spring
forward on 29 March 02:00 → 03:00, fall back on 25 October 03:00 → 02:00)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from automations.cron import CronInvalid, cron_check, last_slot_between, next_slots, zone_get

BERLIN = zone_get("Europe/Berlin")


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_spring_forward_slot_that_does_not_exist_is_skipped():
    slots = next_slots("30 2 * * *", BERLIN, _utc(2026, 3, 27, 12, 0), 3)
    # 28 March 02:30 CET = 01:30 UTC; 29 March 02:30 does not exist; 30 March 02:30 CEST = 00:30 UTC.
    assert slots == [_utc(2026, 3, 28, 1, 30), _utc(2026, 3, 30, 0, 30), _utc(2026, 3, 31, 0, 30)]


def test_fall_back_slot_that_happens_twice_runs_once():
    slots = next_slots("30 2 * * *", BERLIN, _utc(2026, 10, 24, 12, 0), 3)
    # 25 October 02:30 happens at 00:30 UTC (CEST) and 01:30 UTC (CET): only the first is a slot.
    assert slots == [_utc(2026, 10, 25, 0, 30), _utc(2026, 10, 26, 1, 30), _utc(2026, 10, 27, 1, 30)]
    # Starting inside the repeated hour, after the first 02:30: the second one is no slot.
    assert next_slots("30 2 * * *", BERLIN, _utc(2026, 10, 25, 1, 0), 1) == [_utc(2026, 10, 26, 1, 30)]


def test_eight_in_the_morning_in_berlin_follows_summer_time():
    winter = next_slots("0 8 * * 1-5", BERLIN, _utc(2026, 3, 26, 0, 0), 1)
    summer = next_slots("0 8 * * 1-5", BERLIN, _utc(2026, 3, 30, 0, 0), 1)
    assert winter == [_utc(2026, 3, 26, 7, 0)] and summer == [_utc(2026, 3, 30, 6, 0)]


def test_slots_are_increasing_through_the_repeated_hour():
    slots = next_slots("*/15 * * * *", BERLIN, _utc(2026, 10, 24, 23, 50), 12)
    assert slots == sorted(set(slots))
    assert _utc(2026, 10, 25, 0, 30) in slots  # 02:30 CEST
    assert _utc(2026, 10, 25, 1, 30) not in slots  # 02:30 CET: that wall-clock time already had its slot


def test_last_slot_between():
    assert last_slot_between("*/5 * * * *", zone_get("UTC"), _utc(2026, 1, 1, 8, 1), _utc(2026, 1, 1, 8, 12)) == _utc(
        2026, 1, 1, 8, 10
    )
    assert last_slot_between("0 8 * * *", zone_get("UTC"), _utc(2026, 1, 1, 8, 1), _utc(2026, 1, 1, 8, 12)) is None


@pytest.mark.parametrize("expr", ["", "* * * *", "61 * * * *", "* * * * * *", "nope"])
def test_bad_cron_expressions_are_refused(expr):
    with pytest.raises(CronInvalid):
        cron_check(expr)


def test_unknown_zone_is_refused():
    with pytest.raises(CronInvalid):
        zone_get("Mars/Olympus")
    with pytest.raises(CronInvalid):
        zone_get("../etc/passwd")
