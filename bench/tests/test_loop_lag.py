"""``scale_out.py --loop-lag``'s hook (bench/loop_lag/sitecustomize.py) tells a loop that was
busy from one that was held up while it did not run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parents[1] / "loop_lag"

PROGRAM = """
import asyncio, time, uvloop

async def main():
    await asyncio.sleep(0.05)
    began = time.thread_time()
    while time.thread_time() - began < 0.08:  # the loop busy: its own CPU
        pass
    await asyncio.sleep(0.05)
    time.sleep(0.08)  # the loop held up without running (as waiting for the GIL would)
    await asyncio.sleep(0.05)

uvloop.new_event_loop().run_until_complete(main())
"""

_LINE = re.compile(r"LOOPLAG pid=\d+ at=[\d.]+ late=([\d.]+) span=([\d.]+) cpu=([\d.]+) runqueue=([\d.na]+) "
                   r"others=(-?[\d.]+)")


def test_a_late_timer_is_logged_with_what_the_loop_thread_did_meanwhile() -> None:
    env = {**os.environ, "PYTHONPATH": str(HOOK), "LOOP_LAG_ALL": "1", "LOOP_LAG_MIN_MS": "40"}
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = [tuple(map(float, m.groups())) for m in _LINE.finditer(done.stderr)]
    assert len(lines) == 2, done.stderr
    (busy_late, busy_span, busy_cpu, *_), (held_late, held_span, held_cpu, *_) = lines
    assert busy_late >= 40 and busy_cpu >= 70  # the busy loop's lateness is its own CPU
    assert held_late >= 40 and held_cpu < 30  # the held-up loop's is not
    assert busy_span >= busy_late and held_span >= held_late


def test_processes_other_than_web_and_workers_are_not_timed() -> None:
    env = {**os.environ, "PYTHONPATH": str(HOOK), "LOOP_LAG_MIN_MS": "40"}
    env.pop("LOOP_LAG_ALL", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert "LOOPLAG" not in done.stderr
