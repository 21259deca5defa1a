"""``scale_out.py --loop-lag``: put on ``PYTHONPATH`` of the processes the benchmark starts,
this times the event loop of each web process (uvicorn's) and worker (the run host's) and logs
every time it ran a timer :data:`MIN_LATE_MS` or more late, one line on stderr (the process's
log)::

    LOOPLAG pid=<pid> at=<epoch s> late=<ms> span=<ms> cpu=<ms> runqueue=<ms> others=<ms>

A timer is set every :data:`PERIOD_SECONDS`; ``late`` is how long after its due time it ran,
``span`` the time since the previous one ran. Over that span: ``cpu`` is the loop thread's own
CPU (``time.thread_time``: the loop was busy running callbacks), ``runqueue`` the time the loop
thread was runnable but waited for a core (the second field of Linux's
``/proc/<pid>/task/<tid>/schedstat``, "time spent waiting on a runqueue", in ns; see the
kernel's Documentation/scheduler/sched-stats.rst), ``others`` the CPU of the process's other
threads (``time.process_time`` less ``cpu``: request or ORM threads, which may hold the GIL
the loop waits for). The rest of the span the loop thread slept: in its poll until the timer
was due, or on the GIL.

Only processes whose command line names ``agent_platform.web`` or a Celery worker are timed
(every process with ``LOOP_LAG_ALL=1``), and only loops made by ``uvloop.new_event_loop`` (both
kinds use uvloop by default: ``RUN_HOST_LOOP``, uvicorn's ``--loop auto``). The timer and its
reads of ``/proc`` cost each timed process ~200 wake-ups a second."""

import os
import sys
import threading
import time

MIN_LATE_MS = float(os.environ.get("LOOP_LAG_MIN_MS", "10"))
PERIOD_SECONDS = 0.005


def _timed(loop) -> None:
    state: dict = {}

    def runqueue_seconds() -> float:
        try:
            with open(state["schedstat"]) as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return float("nan")

    def tick() -> None:
        if "schedstat" not in state:
            state["schedstat"] = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        now, cpu, process_cpu, runqueue = time.perf_counter(), time.thread_time(), time.process_time(), runqueue_seconds()
        if "due" in state:
            late_ms = (now - state["due"]) * 1000.0
            if late_ms >= MIN_LATE_MS:
                own = cpu - state["cpu"]
                sys.stderr.write(
                    f"LOOPLAG pid={os.getpid()} at={time.time():.3f} late={late_ms:.1f} "
                    f"span={(now - state['at']) * 1000:.1f} cpu={own * 1000:.1f} "
                    f"runqueue={(runqueue - state['runqueue']) * 1000:.1f} "
                    f"others={(process_cpu - state['process_cpu'] - own) * 1000:.1f}\n")
                sys.stderr.flush()
        state.update(at=now, due=now + PERIOD_SECONDS, cpu=cpu, process_cpu=process_cpu, runqueue=runqueue)
        loop.call_later(PERIOD_SECONDS, tick)

    loop.call_soon(tick)


def _install() -> None:
    import uvloop

    make = uvloop.new_event_loop

    def new_event_loop():
        loop = make()
        _timed(loop)
        return loop

    uvloop.new_event_loop = new_event_loop


if os.environ.get("LOOP_LAG_ALL") == "1" or any(name in " ".join(sys.orig_argv) for name in ("agent_platform.web", " worker ")):
    _install()
