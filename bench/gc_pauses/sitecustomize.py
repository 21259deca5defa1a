"""``scale_out.py --gc-pauses``: put on ``PYTHONPATH`` of the processes the benchmark starts,
this logs each garbage collection that stopped its process for :data:`MIN_MS` or more, one line
on stderr (the process's log)::

    GCPAUSE pid=<pid> at=<epoch seconds, end of the collection> gen=<0|1|2> ms=<wall ms> collected=<n>

A collection stops every thread of the process (it holds the GIL), so a web process's
WebSocket frames and a worker's streamed tokens wait for it. ``gc.callbacks`` times each
collection from its start to its stop (CPython's documented hook)."""

import gc
import os
import sys
import time

MIN_MS = float(os.environ.get("GC_PAUSE_MIN_MS", "20"))
_started = [0.0]


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _started[0]) * 1000.0
    if ms >= MIN_MS:
        sys.stderr.write(f"GCPAUSE pid={os.getpid()} at={time.time():.3f} gen={info['generation']} ms={ms:.1f} "
                         f"collected={info['collected']}\n")
        sys.stderr.flush()


gc.callbacks.append(_timed)
