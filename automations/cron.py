"""Cron slots on a time zone's wall clock, as UTC instants.

A slot is a wall-clock time of the schedule's IANA zone that the cron expression matches
(cronsim iterates naive wall-clock times). Daylight-saving rule (stated policy):

- a wall-clock time that does not exist (spring forward: Europe/Berlin 2026-03-29 02:30) is no
  slot: the schedule does not run that day at that time;
- a wall-clock time that happens twice (fall back: Europe/Berlin 2026-10-25 02:30) is one slot,
  its first occurrence (``fold=0``): the schedule runs once.

Mapping the existing wall-clock times to their first occurrence is strictly increasing, so the
slots come out in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

_LOOK_BACK = timedelta(hours=3)
"""How far before a start's wall-clock time iteration begins (covers a repeated hour)."""


class CronInvalid(ValueError):
    """A cron expression or time zone that cannot be used (the message says which)."""


def zone_get(name: str) -> ZoneInfo:
    """The IANA zone ``name``. Raises :class:`CronInvalid` for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronInvalid(f"Unknown time zone {name!r} (an IANA name such as Europe/Berlin).") from exc


def cron_check(expr: str) -> str:
    """``expr`` stripped, if cronsim accepts it (five fields); else :class:`CronInvalid`."""
    expr = " ".join(str(expr).split())
    if len(expr.split(" ")) != 5:
        raise CronInvalid("A cron expression has five fields: minute hour day-of-month month day-of-week.")
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise CronInvalid(f"Invalid cron expression {expr!r}: {exc}.") from exc
    return expr


def _first_occurrence(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The UTC instant of the naive ``wall`` time in ``zone`` (its first occurrence), or None
    when that wall-clock time does not exist there."""
    aware = wall.replace(tzinfo=zone, fold=0)
    instant = aware.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return instant


def slots_from(expr: str, zone: ZoneInfo, start: datetime) -> Iterator[datetime]:
    """The slots (UTC, aware) at or after ``start`` (aware), in order, without end."""
    wall = (start.astimezone(zone) - _LOOK_BACK).replace(tzinfo=None, second=0, microsecond=0)
    for candidate in CronSim(expr, wall):
        instant = _first_occurrence(candidate, zone)
        if instant is not None and instant >= start:
            yield instant


def next_slots(expr: str, zone: ZoneInfo, start: datetime, count: int) -> list[datetime]:
    """The first ``count`` slots at or after ``start`` (UTC)."""
    out: list[datetime] = []
    for instant in slots_from(expr, zone, start):
        out.append(instant)
        if len(out) >= count:
            break
    return out


def last_slot_between(expr: str, zone: ZoneInfo, start: datetime, end: datetime) -> datetime | None:
    """The latest slot in ``[start, end]``, or None."""
    last = None
    for instant in slots_from(expr, zone, start):
        if instant > end:
            break
        last = instant
    return last
