"""Figures shared by the benchmarks (no Django, no project imports)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0–1) with linear interpolation between closest ranks; NaN if empty."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """One line describing the machine the figures come from."""
    return f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}"
