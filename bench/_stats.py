"""Figures shared by the benchmarks (no Django, no project imports)."""

from __future__ import annotations

import itertools
import os
import platform
import statistics
from collections.abc import Callable
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


def alternating_rounds(variants: dict[str, Callable[[], tuple[float, float]]], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Run each variant's round ``rounds`` times, alternating (ABAB…); each round returns its
    (CPU, wall) per operation in µs. The figures by variant name, in round order."""
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _, (name, one_round) in zip(range(rounds * len(variants)), itertools.cycle(variants.items()), strict=False):
        figures[name].append(one_round())
    return figures


def print_cpu_and_wall(figures: dict[str, list[tuple[float, float]]], per: str) -> None:
    """One line per variant: the median and range of its rounds' CPU and wall µs ``per`` operation."""
    for name, rounds in figures.items():
        cpu, wall = [r[0] for r in rounds], [r[1] for r in rounds]
        print(f"  {name}: CPU {statistics.median(cpu):.0f} µs per {per} ({min(cpu):.0f}–{max(cpu):.0f}), "
              f"wall {statistics.median(wall):.0f} µs ({min(wall):.0f}–{max(wall):.0f})")
