"""Tracing's cost per turn in instructions: ``turn_overhead.py`` under Valgrind, off against on.

Issue 40's goal is that tracing off adds nothing measurable to a turn and tracing on at most 5 %
of its CPU. Timings on a shared 2-core machine spread by ±10 % (bench/README.md, "Tracing cost"),
so they cannot settle a few per cent; the number of instructions the process executes can: with
``PYTHONHASHSEED=0`` a process's count repeats to 0.002-0.13 % (not exactly: the database's ids,
the throwaway tenant's random names, timestamps, and the threads' timed waits and how the fake
model's stream arrives, which depend on the wall clock, differ from process to process; the
spread grows with the runs, so it weighs on the per-turn difference: bench/README.md, "Tracing
cost"); the script runs every configuration in each of ``--rounds`` rounds and prints how far
the counts of one configuration spread.

What it runs: ``bench/turn_overhead.py --tracing off|on --worker-tuning --no-parts`` under
``valgrind --tool=cachegrind --cache-sim=no`` (counts instructions only), one process at a time
(two at once slow each other down enough for the model client to time out), each with
``--runs 1`` and ``--runs 1+K``. The difference of the two counts of a mode cancels the start-up
(Django's imports, the database set-up, the first, cold run: about 35 G instructions) and leaves
K warm runs of 20 turns: divided by ``K * 20``, the instructions per turn. Printed: each
process's total, each mode's instructions per turn, on − off per turn and its percentage of off.

- ``--worker-tuning``: the worker's run host runs with its interpreter tuning (``gc.freeze()``,
  its GC thresholds), so this measures with it; the collections per generation of each process
  are printed (a full collection in one mode's window and not the other's would skew the
  difference).
- ``--no-parts``: ``turn_overhead.py`` would otherwise run microbenchmarks of the tracing paths
  after the runs, which would count.
- ``--model-timeout``: Valgrind slows the process down ~15 times here; the agent's model client
  gets generous connect and read timeouts (this benchmark's tenant only), so that no run ends
  ``model_unavailable``. A process whose runs do not all take their 20 turns exits non-zero
  (``turn_overhead.py`` names the run, its status and reason) and this script stops: a failed
  run invalidates the count.

What is counted: the benchmark's process only (the run loop, its database threads, the span
processor's thread). Valgrind does not follow the fake model (``bench/_fake_model.py``, started
with fork and exec: ``--trace-children=no``), and PostgreSQL and Redis are other processes. Their
work is the same for off and on: the spans go to an exporter in the process that counts and
drops them (``bench/_tracing_mode.py``: no network, no OTLP collector), ``on`` does not install
the psycopg and redis instrumentations (``on-libraries``, not measured here, does), and no trace
or span id is written to a row or an event. Instructions are not CPU time: memory and cache stalls are not in the count, while
every instruction of the span processor's thread is.

Run: ``.venv/bin/python bench/tracing_instructions.py [--runs K] [--rounds R]`` (K, default 20: the
warm runs measured per mode; R, default 2: rounds of the four processes, whose counts show how
repeatable they are; 4 R Valgrind processes of 75-95 s each here, one after another).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _stats import machine

ROOT = Path(__file__).resolve().parents[1]
TURNS = 20
"""Turns per run of ``turn_overhead.py``."""
MODEL_TIMEOUT_SECONDS = 600.0
"""The model client's connect and read timeouts under Valgrind (``turn_overhead.py --model-timeout``)."""
VALGRIND_ARGS = ("--tool=cachegrind", "--cache-sim=no", "--branch-sim=no", "--trace-children=no")


@dataclass(frozen=True)
class Measurement:
    """One Valgrind process: ``turn_overhead.py --tracing mode --runs runs``."""

    mode: str
    runs: int
    instructions: int
    """Instructions the process executed, all its threads (cachegrind's ``Ir`` total)."""
    collections: tuple[int, ...]
    """Garbage collections per generation (0, 1, 2) in the runs' window (``turn_overhead.py``'s report)."""
    spans: str
    """Spans per turn exported (``on``), else ``""``."""
    seconds: float
    """Wall time of the process under Valgrind, seconds."""


def valgrind_command(mode: str, runs: int, out_file: Path) -> list[str]:
    """The command line that measures ``turn_overhead.py --tracing mode --runs runs`` into
    ``out_file`` (cachegrind's output; ``%p`` in its name is the process id)."""
    return ["valgrind", *VALGRIND_ARGS, f"--cachegrind-out-file={out_file}", sys.executable,
            str(ROOT / "bench" / "turn_overhead.py"), "--runs", str(runs), "--tracing", mode, "--worker-tuning",
            "--no-parts", "--model-timeout", f"{MODEL_TIMEOUT_SECONDS:g}"]


def total_instructions(out_file: Path) -> int:
    """The ``Ir`` total of a cachegrind (or callgrind) output file: the first number of its
    ``summary:`` (callgrind: ``totals:``) line. Raises ValueError if the file has none."""
    text = out_file.read_text()
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"{out_file}: no summary line")
    return int(found.group(1))


def measure(mode: str, runs: int, work_dir: Path) -> Measurement:
    """Run ``turn_overhead.py --tracing mode --runs runs`` under Valgrind (``PYTHONHASHSEED=0``)
    and read its instruction count.

    Raises RuntimeError if the process fails (a run that did not take its 20 turns makes
    ``turn_overhead.py`` exit non-zero, naming the run's status and reason), its report is not
    there, or Valgrind wrote no output for it.
    """
    out_pattern = work_dir / f"cachegrind.{mode}.{runs}.%p"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    started = time.monotonic()
    proc = subprocess.Popen(valgrind_command(mode, runs, out_pattern), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate()
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"--tracing {mode} --runs {runs} exited {proc.returncode}:\n{stdout}\n{stderr[-3000:]}")
    if f"{runs} runs x {TURNS} turns" not in stdout:
        raise RuntimeError(f"--tracing {mode} --runs {runs}: no summary of its runs:\n{stdout}")
    out_file = Path(str(out_pattern).replace("%p", str(proc.pid)))
    if not out_file.exists():
        raise RuntimeError(f"no cachegrind output {out_file} (files: {sorted(p.name for p in work_dir.iterdir())})")
    collections = tuple(int(n) for n in re.findall(r"gen\d (\d+) \(", stdout))
    spans = re.search(r"([\d.]+) spans per turn exported", stdout)
    return Measurement(mode=mode, runs=runs, instructions=total_instructions(out_file), collections=collections,
                       spans=spans.group(1) if spans else "", seconds=seconds)


def per_turn(base: Measurement, longer: Measurement) -> float:
    """Instructions per warm turn of a mode: the difference of the two processes' counts over the
    difference of their turns. Raises ValueError unless both are of one mode and ``longer`` has
    more runs."""
    if base.mode != longer.mode or longer.runs <= base.runs:
        raise ValueError(f"need one mode and more runs: {base.mode}/{base.runs}, {longer.mode}/{longer.runs}")
    return (longer.instructions - base.instructions) / ((longer.runs - base.runs) * TURNS)


def report(rounds: list[dict[tuple[str, int], Measurement]], warm_runs: int) -> str:
    """The figures as Markdown: one row per process; per round, each mode's instructions per turn
    (by difference) and on − off; the spread of each configuration's count over the rounds.

    ``rounds``: per round, the measurements by ``(mode, runs)``, with ``runs`` 1 and
    ``1 + warm_runs`` of ``off`` and ``on``. Raises KeyError if one is missing.
    """
    lines = ["| round | mode | runs | instructions | GC collections gen0/1/2 | spans per turn | wall |",
             "|---|---|---|---|---|---|---|"]
    for i, measured in enumerate(rounds, 1):
        for m in measured.values():
            lines.append(f"| {i} | {m.mode} | {m.runs} | {m.instructions:,} | {'/'.join(map(str, m.collections))} "
                         f"| {m.spans or '-'} | {m.seconds:.0f} s |")
    lines += ["", "| round | off: instructions per turn | on: instructions per turn | on - off per turn | % of off |",
              "|---|---|---|---|---|"]
    results = []
    for i, measured in enumerate(rounds, 1):
        off, on = (per_turn(measured[(mode, 1)], measured[(mode, 1 + warm_runs)]) for mode in ("off", "on"))
        results.append((off, on))
        lines.append(f"| {i} | {off:,.0f} | {on:,.0f} | {on - off:+,.0f} | {(on - off) / off * 100:+.2f} % |")
    if len(results) > 1:
        off = sum(r[0] for r in results) / len(results)
        on = sum(r[1] for r in results) / len(results)
        lines.append(f"| mean | {off:,.0f} | {on:,.0f} | {on - off:+,.0f} | {(on - off) / off * 100:+.2f} % |")
        lines.append("")
        lines.append("Repeatability, the same configuration in each round (PYTHONHASHSEED=0):")
        for key in rounds[0]:
            counts = [measured[key].instructions for measured in rounds]
            spread = max(counts) - min(counts)
            lines.append(f"- --tracing {key[0]} --runs {key[1]}: {' / '.join(f'{c:,}' for c in counts)}: "
                         f"spread {spread:,} ({spread / min(counts) * 1e6:.0f} ppm; "
                         f"{spread / (warm_runs * TURNS):,.0f} per turn if it fell in one mode's difference)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, metavar="K", help="warm runs measured per mode (default 20)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the four processes (default 2: the second shows how repeatable the counts are)")
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be at least 1")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found")
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    plan = [("off", 1), ("on", 1), ("off", 1 + args.runs), ("on", 1 + args.runs)]
    rounds: list[dict[tuple[str, int], Measurement]] = []
    with tempfile.TemporaryDirectory(prefix="tracing-instructions-") as work:
        for i in range(1, args.rounds + 1):
            rounds.append({})
            for mode, runs in plan:  # one Valgrind process at a time
                print(f"round {i}: valgrind ... --tracing {mode} --runs {runs}", file=sys.stderr, flush=True)
                m = rounds[-1][(mode, runs)] = measure(mode, runs, Path(work))
                print(f"  {m.instructions:,} instructions in {m.seconds:.0f} s", file=sys.stderr, flush=True)
    print(f"machine: {machine()}; {version}")
    print(f"turn_overhead.py --worker-tuning --no-parts --model-timeout {MODEL_TIMEOUT_SECONDS:g} under valgrind "
          f"{' '.join(VALGRIND_ARGS)}, PYTHONHASHSEED=0; {args.runs} warm runs x {TURNS} turns per mode and round")
    print(report(rounds, args.runs))

if __name__ == "__main__":
    main()
