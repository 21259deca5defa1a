"""N concurrent streaming chat completions through ``/api/openai/v1`` (issue 36's goal: at N = 200,
token → client p95 ≤ 50 ms and no answer token lost, as the WebSocket gives in
``concurrent_runs.py``).

The same run as ``concurrent_runs.py``'s: the fake model (``timed3``, its own process) waits 1 s
before each of 3 turns (two tool calls, then a 50-token answer streamed one token every 10 ms,
each token the wall-clock time it was written). Here every run is started by a client's ``POST
/chat/completions`` with ``stream: true`` (a new chat each), and answered as
``chat.completion.chunk`` Server-Sent Events by the web process (uvicorn, the project's ASGI
app), while a Celery worker (threads pool, one process, ``WORKER_CONCURRENCY`` ≥ N) runs them:
the production arrangement (``bench/_doors.py``). The N clients (``bench/_openai_clients.py``,
their own process) send their requests at once and read every stream to ``[DONE]``.

Printed per round:

- **token → client**: the time the client read the line carrying an answer token minus the time
  the fake model wrote it (same host, same clock), p50 / p95 / max over the round's 50 × N tokens;
- **tokens lost**: 50 × N minus the answer tokens the clients received; streams that did not end
  with the finish chunk and ``[DONE]``; client errors;
- CPU per run of the worker, the web process and the harness (fake model and clients), from
  ``/proc``; how busy the whole machine was (``/proc/stat``, all cores); load average.

An N given more than once (``--n 200 200 200``) also gets a line over all its rounds together.
``--sdk`` reads the streams with the official ``openai`` SDK instead of plain httpx (its client
builds a pydantic object per chunk, which costs the shared cores more).

Run: ``.venv/bin/python bench/openai_stream_fanout.py [--n 50 100 200] [--sdk] [--warmup 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _doors  # first of the project's modules: the environment the three processes share
from _harness import cpu_seconds, machine_busy_seconds, percentile
from _stats import machine

TOKENS_PER_RUN = 50
TARGET_P95_MS = 50.0


def one_round(platform: _doors.Platform, n: int, *, sdk: bool, timeout: float = 180) -> dict:
    """N streaming chat completions at once; prints the round's line and returns the clients'
    result (``_openai_clients.py``'s JSON) with ``lost`` (answer tokens not received)."""
    web0, worker0 = platform.cpu()
    model0 = cpu_seconds(platform.model_pid)
    busy0 = machine_busy_seconds()
    started = time.perf_counter()
    clients = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_openai_clients.py"))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    clients.stdin.write(json.dumps({"base": f"{platform.base}/api/openai/v1", "token": platform.token,
                                    "model": platform.agent.slug, "n": n, "timeout": timeout, "sdk": sdk}) + "\n")
    clients.stdin.flush()
    result = json.loads(clients.stdout.readline())
    wall = time.perf_counter() - started
    harness = cpu_seconds(clients.pid) + cpu_seconds(platform.model_pid) - model0  # read before it is reaped
    clients.wait(timeout=30)
    time.sleep(0.3)  # the worker finishes the runs' ends
    web1, worker1 = platform.cpu()
    busy1 = machine_busy_seconds()
    lat = result["latencies_ms"]
    result["lost"] = TOKENS_PER_RUN * n - sum(result["tokens"])
    print(
        f"N={n:4d}: wall {wall:5.1f} s (ideal ~3.5 s); token→client p50 {percentile(lat, 0.5):.1f} ms "
        f"p95 {percentile(lat, 0.95):.1f} ms max {max(lat, default=float('nan')):.1f} ms ({len(lat)} tokens); "
        f"answer tokens lost {result['lost']}, streams ended with [DONE] {result['done']}/{n}; "
        f"CPU per run: worker {(worker1 - worker0) / n * 1000:.1f} ms, web {(web1 - web0) / n * 1000:.1f} ms, "
        f"harness (fake model + clients) {harness / n * 1000:.1f} ms; machine busy "
        f"{(busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) * 100:.0f} %, load average {os.getloadavg()[0]:.2f}"
        + (f"; client errors {len(result['errors'])}: {result['errors'][:3]}" if result["errors"] else ""),
        flush=True,
    )
    if result["unfinished"]:
        print(f"        streams without [DONE]: {_unfinished(result['unfinished'])}", flush=True)
    return result


def _unfinished(streams: list[dict]) -> str:
    """The runs of the streams that did not end, with what their clients saw and the run's status."""
    from sessions.models import Run

    status = dict(Run.all_tenants.filter(pk__in=[s["run"] for s in streams if s["run"]])
                  .values_list("pk", "status"))
    return "; ".join(f"run {s['run']} ({status.get(s['run'], '?')}): {s['tokens']} tokens, "
                     f"finish chunk {'seen' if s['finished'] else 'not seen'}" for s in streams[:5])


def print_pooled(n: int, rounds: list[dict]) -> None:
    """An N run in several rounds: the token latency over all their tokens, and how many rounds
    had their own p95 within :data:`TARGET_P95_MS`."""
    pooled = [x for r in rounds for x in r["latencies_ms"]]
    within = sum(percentile(r["latencies_ms"], 0.95) <= TARGET_P95_MS for r in rounds)
    print(f"N={n:4d}, all {len(rounds)} rounds together: token→client p50 {percentile(pooled, 0.5):.1f} ms "
          f"p95 {percentile(pooled, 0.95):.1f} ms max {max(pooled, default=float('nan')):.1f} ms "
          f"({len(pooled)} tokens); rounds with p95 ≤ {TARGET_P95_MS:g} ms: {within} of {len(rounds)}; "
          f"answer tokens lost {sum(r['lost'] for r in rounds)}, client errors {sum(len(r['errors']) for r in rounds)}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--sdk", action="store_true", help="read the streams with the openai SDK (default: httpx)")
    parser.add_argument("--warmup", type=int, default=5, help="runs of an unreported first round (0: none)")
    args = parser.parse_args()
    with _doors.Platform("timed3", worker_concurrency=max(200, *args.n), read_timeout_seconds=60.0) as platform:
        platform.agent.refresh_from_db()
        print(f"{machine()}; load average {os.getloadavg()[0]:.2f}; clients: {'openai SDK' if args.sdk else 'httpx'}",
              flush=True)
        if args.warmup:
            print(f"warm-up round ({args.warmup} runs):", flush=True)
            one_round(platform, args.warmup, sdk=args.sdk)
        results: dict[int, list[dict]] = {}
        for n in args.n:
            results.setdefault(n, []).append(one_round(platform, n, sdk=args.sdk))
        for n, rounds in results.items():
            if len(rounds) > 1:
                print_pooled(n, rounds)


if __name__ == "__main__":
    main()
