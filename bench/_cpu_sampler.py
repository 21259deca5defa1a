"""Samples every process's CPU time in its own process (so the sampling costs the measured
process nothing): ``python bench/_cpu_sampler.py <interval seconds>`` reads ``/proc`` every
interval until its stdin is closed, then prints one JSON line::

    {"samples": [[perf_counter, {"<pid>": cpu seconds, …}], …], "commands": {"<pid>": "cmdline", …}}

Used by :class:`bench._harness.CpuTimeline`. Linux only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def stat_cpu_seconds(path: str) -> float:
    """utime + stime, seconds, from a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat``
    file (fields 14 and 15 of proc(5), counted after the command name's closing parenthesis).

    Raises:
        OSError: the process is gone.
    """
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _snapshot(commands: dict[str, str]) -> dict[str, float]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            out[entry] = stat_cpu_seconds(f"/proc/{entry}/stat")
            if entry not in commands:
                commands[entry] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
        except OSError:
            out.pop(entry, None)
    return out


def main() -> None:
    interval = float(sys.argv[1])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    samples: list = []
    commands: dict[str, str] = {}
    while not stop.is_set():
        samples.append([time.perf_counter(), _snapshot(commands)])
        stop.wait(interval)
    samples.append([time.perf_counter(), _snapshot(commands)])
    print(json.dumps({"samples": samples, "commands": commands}), flush=True)


if __name__ == "__main__":
    main()
