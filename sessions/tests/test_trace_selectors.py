"""Where the run trace puts a compaction (:func:`sessions.trace_selectors._compaction_turn`):
the turn of the summary request saved just before it, else the first turn answered after it,
else the last turn. No database: the rows are stand-ins with the fields it reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from sessions.trace_selectors import _compaction_turn

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _place(compaction_at: int, *, calls: list[tuple[int, int, int]], first_ats: list[int | None]) -> int | None:
    """The turn number the compaction made at ``compaction_at`` goes to; ``calls``: the run's
    summary requests as ``(pk, turn, seconds)``; ``first_ats``: turn k's first answer call."""
    turns = [{"turn": k} for k in range(len(first_ats))]
    target = _compaction_turn(
        SimpleNamespace(created_at=_at(compaction_at)), turns=turns,
        first_ats=[None if s is None else _at(s) for s in first_ats],
        compaction_calls=[SimpleNamespace(pk=pk, turn=turn, created_at=_at(s)) for pk, turn, s in calls],
    )
    return None if target is None else target["turn"]


def test_the_summary_request_saved_just_before_it_decides() -> None:
    calls = [(1, 0, 5), (2, 2, 9), (3, 1, 9), (4, 1, 30)]  # pk 3 and 2 at the same time: the later pk wins
    assert _place(10, calls=calls, first_ats=[0, 20, 40]) == 1
    assert _place(31, calls=calls, first_ats=[0, 20, 40]) == 1
    assert _place(6, calls=calls, first_ats=[0, 20, 40]) == 0


def test_without_such_a_request_the_first_turn_answered_after_it() -> None:
    assert _place(10, calls=[], first_ats=[0, None, 20, 40]) == 2
    assert _place(10, calls=[(1, 0, 11)], first_ats=[0, 10, 40]) == 1  # a request after it does not count
    # A request of a turn the trace does not have: as if there were none.
    assert _place(10, calls=[(1, 7, 9)], first_ats=[0, 15]) == 1


def test_else_the_last_turn_and_no_turn_at_all_is_none() -> None:
    assert _place(50, calls=[], first_ats=[0, 20, None]) == 2
    assert _place(50, calls=[], first_ats=[]) is None
