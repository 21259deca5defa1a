"""Garbage-collector tuning for the long-running processes that stream events.

Both the worker (its run host, sessions/runner/host.py) and the web process (the ASGI app,
agent_platform/asgi.py) hold every object of Django, the project's modules and their
libraries, hundreds of thousands of them. CPython's full collection walks all of them: on the
2-vCPU benchmark machine it stopped the worker's loop for 150–165 ms twice a round of
``bench/concurrent_runs.py`` at 200 runs, and the web process for 147–200 ms in three rounds
of five. Every token in flight waited that long (bench/README.md).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence


def gc_freeze_and_set_thresholds(thresholds: Sequence[int]) -> None:
    """Take every object alive now out of later collections, then set the collector's
    thresholds.

    ``gc.freeze()`` moves what exists into the permanent generation: those objects are still
    freed by reference counting, only reference cycles among them would stay. Call it once
    the process is set up (modules imported, app built). CPython's docs on ``gc.freeze``
    recommend it for exactly this (and for fork's copy-on-write).

    Args:
        thresholds: ``(generation 0, generation 1, generation 2)`` for ``gc.set_threshold``
            (CPython's defaults: 700, 10, 10). A larger first value makes young collections
            rarer and longer.

    Raises:
        ValueError: not three positive integers.
    """
    if len(thresholds) != 3 or min(thresholds) < 1:
        raise ValueError(f"GC thresholds must be three positive integers, got {tuple(thresholds)!r}")
    gc.freeze()
    gc.set_threshold(*thresholds)
