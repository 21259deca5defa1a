"""Concurrent runs on one worker process, watched live over WebSockets.

N runs start at once on one event loop (as the worker's RunHost hosts them). The fake model
(its own process, ``timed3``) waits 1 s before every answer of a 3-turn run (two tool calls,
then a 50-token answer streamed one token every 10 ms), so a run needs ~3.5 s of model time;
if runs overlap fully, N runs finish in ~3.5 s whatever N is.

Every session is followed by a WebSocket client (bench/_ws_clients.py, its own process)
through the real ASGI server (uvicorn, its own process, as in production) from seq 0, so the
figures include:

- token → client latency: from the moment the fake model wrote a token to the socket to the
  moment the WebSocket client received the frame carrying it (p50/p95/max over all tokens);
- lost events: seqs 1…last of each session (the last one the publisher handed out) that the
  client never received, plus duplicates, plus answer tokens sent but not received;
- CPU seconds of the worker process (the runs) and of the web process (the consumers), per run;
  of the harness (the fake model and the WebSocket clients, which share the same cores); and
  how busy the whole machine was during the round (all cores, ``/proc/stat``).

``--stages`` also prints the token latency at four points inside the worker (where the runner
gets the token from the adapter, where its event is queued for Redis, where it is written to
Redis's socket, where Redis's reply to it is read), which tells the worker's share of the
delay from the web process's.

An N given more than once (``--n 200 200 200``) also gets a line over all its rounds together:
the token latency over every token of them, and in how many rounds the round's own p95 was
within issue 4's 50 ms.

``--timeline`` prints, for the last round, how much CPU each process group (this worker, the
web process, the WebSocket clients, the fake model, Redis, PostgreSQL) used per 250 ms: whether
a slow round was the worker's own work or a machine with every core busy.

Run: ``.venv/bin/python bench/concurrent_runs.py [--n 50 100 200] [--stages] [--timeline] [--db-threads K] [--pg-connections K] [--db [TOP]] [--analyze] [--profile out.txt]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# Before _harness loads the settings (the web process inherits this environment too): the fake
# model listens on loopback, which the outbound address rules refuse unless allowed (a run
# would fail with model_unavailable), and every session's WebSocket client is the same user,
# whom STREAMS_PER_USER_MAX (20) would close with 4429 beyond 20 streams.
os.environ.setdefault("OUTBOUND_ALLOWED_CIDRS", "127.0.0.0/8")
os.environ.setdefault("STREAMS_PER_USER_MAX", "1000000")

from _harness import ROOT, BenchTenant, CpuTimeline, cpu_seconds, fake_model, machine_busy_seconds, percentile
from _pg_stats import DatabaseWatch, analyze
from django.conf import settings

from sessions.models import Run
from sessions.runner.host import new_run_loop, tune_interpreter_for_runs
from sessions.runner.loop import execute_run
from tenants.services import api_token_create, membership_create

TOKENS_PER_RUN = 50
TURNS_PER_RUN = 3
"""Model turns of every run (``timed3``: two tool calls, then the answer)."""


TIMELINE_GROUPS = {"agent_platform.web": "web", "_ws_clients": "clients", "_fake_model": "model", "redis-server": "redis",
                   "postgres": "postgres"}
"""``--timeline``: process groups by a substring of their command line (:class:`_harness.CpuTimeline`)."""

STAGES: dict[str, list[float]] | None = None
"""``--stages``: token latency (ms) at points inside the worker, by stage name."""
_TIME_MARK = re.compile(r"\d{10}\.\d{6}")


def watch_stages() -> dict[str, list[float]]:
    """Record each answer token's latency where the runner hands it to the batcher, where its
    event is queued for Redis, where the queued events are written to Redis's socket, and
    where Redis's reply is read (same clock as the fake model)."""
    from sessions import events
    from sessions.runner import adapters, loop

    stages: dict[str, list[float]] = {"runner": [], "publish queued": [], "written": [], "reply read": []}
    add, publish_nowait, write = loop._StreamedTextBatcher.add, adapters.event_publish_nowait, events._Publisher._write
    marks_of: dict[asyncio.Future, list[float]] = {}

    def timed_add(self, event_type: str, text: str) -> None:
        now = time.time()
        stages["runner"].extend((now - float(m)) * 1000 for m in _TIME_MARK.findall(text))
        add(self, event_type, text)

    def timed_publish_nowait(**kwargs):
        start = time.time()
        sent = publish_nowait(**kwargs)
        if kwargs["type"] == "content_token":
            marks = [float(m) for m in _TIME_MARK.findall(kwargs["data"]["text"])]
            stages["publish queued"].extend((start - m) * 1000 for m in marks)
            marks_of[sent] = marks

            def done(_) -> None:
                now = time.time()
                stages["reply read"].extend((now - m) * 1000 for m in marks)
                marks_of.pop(sent, None)

            sent.add_done_callback(done)
        return sent

    def timed_write(self) -> None:
        now = time.time()
        queued = [marks_of.get(future) for _, future in self._queued]
        write(self)
        if not self._queued:  # written (else it waits for a connection and is timed then)
            for marks in queued:
                stages["written"].extend((now - m) * 1000 for m in marks or ())

    loop._StreamedTextBatcher.add = timed_add
    adapters.event_publish_nowait = timed_publish_nowait  # the production publisher's nowait
    events._Publisher._write = timed_write
    return stages


async def run_all(run_ids: list[int], tenant_id: int) -> list[float]:
    async def one(run_id: int) -> float:
        start = time.perf_counter()
        await execute_run(run_id, tenant_id=tenant_id)  # as the task that message_post sends
        return time.perf_counter() - start

    return await asyncio.gather(*(one(r) for r in run_ids))


def _run_on_host_loop(coro):
    """Run ``coro`` on a loop like the worker's run host's (RUN_HOST_LOOP), on this thread."""
    with asyncio.Runner(loop_factory=new_run_loop) as runner:
        return runner.run(coro)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebServer:
    """The web process as production starts it (``python -m agent_platform.web``: uvicorn with the
    project's ASGI app and server options) on a free port, same settings as this process."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/python"), "-m", "agent_platform.web", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=dict(os.environ),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("uvicorn did not start")

    def close(self) -> None:
        self.proc.terminate()  # uvicorn waits for open WebSockets to close; not for long
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _last_seqs(session_ids: list[int]) -> dict[int, int]:
    from agent_platform.redis_clients import sync_redis
    from sessions.events import session_keys

    pipe = sync_redis().pipeline()
    for sid in session_ids:
        pipe.get(session_keys(sid)[0])
    return {sid: int(v or 0) for sid, v in zip(session_ids, pipe.execute(), strict=False)}


TARGET_P95_MS = 50.0
"""Issue 4's target: token → client p95 at most this, with 200 runs at once."""


@dataclass
class RoundResult:
    """What one round delivered: every answer token's latency (ms) and the events it lost."""

    latencies_ms: list[float]
    lost: int
    duplicates: int
    tokens_lost: int


def one_round(bench: BenchTenant, token: str, web: WebServer, model_pid: int, n: int, profile: str | None,
              timeline: CpuTimeline | None = None, db: DatabaseWatch | None = None,
              analyze_first: bool = False) -> RoundResult:
    runs = [bench.new_run() for _ in range(n)]
    if analyze_first:
        analyze()  # plans for the round's rows, as in a populated database (_pg_stats.analyze)
    sessions = [r.session_id for r in runs]
    clients = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_ws_clients.py"))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    clients.stdin.write(json.dumps({"url": f"ws://127.0.0.1:{web.port}", "token": token, "sessions": sessions,
                                    "timeout": 180}) + "\n")
    clients.stdin.flush()
    if clients.stdout.readline().strip() != "ready":
        raise RuntimeError("the WebSocket clients did not connect")
    web_cpu = cpu_seconds(web.proc.pid)
    harness_cpu = cpu_seconds(model_pid) + cpu_seconds(clients.pid)
    busy, total = machine_busy_seconds()
    if db is not None:
        db.start()
    cpu = time.process_time()
    loop_cpu = cpu_seconds(os.getpid(), threading.get_native_id())  # asyncio.run runs the loop on this thread
    started = time.perf_counter()
    if timeline is not None:
        timeline.start()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        durations = profiler.runcall(_run_on_host_loop, run_all([r.pk for r in runs], bench.tenant.pk))
        with open(profile, "w") as fh:
            pstats.Stats(profiler, stream=fh).sort_stats("tottime").print_stats(60)
            pstats.Stats(profiler, stream=fh).sort_stats("cumulative").print_stats(80)
    else:
        durations = _run_on_host_loop(run_all([r.pk for r in runs], bench.tenant.pk))
    wall = time.perf_counter() - started
    if timeline is not None:
        timeline.stop()
    cpu = time.process_time() - cpu
    loop_cpu = cpu_seconds(os.getpid(), threading.get_native_id()) - loop_cpu
    result = json.loads(clients.stdout.readline())
    if db is not None:
        db.stop()
    harness_cpu = cpu_seconds(model_pid) + cpu_seconds(clients.pid) - harness_cpu  # read before it is reaped
    busy, total = (now - then for now, then in zip(machine_busy_seconds(), (busy, total), strict=False))
    clients.wait(timeout=30)
    web_cpu = cpu_seconds(web.proc.pid) - web_cpu
    statuses = list(Run.all_tenants.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True))
    completed = statuses.count("completed")
    last = _last_seqs(sessions)
    lost = dup = tokens_lost = 0
    for sid in sessions:
        got = result["sessions"].get(str(sid), {"seqs": [], "tokens": 0})
        lost += len(set(range(1, last[sid] + 1)) - set(got["seqs"]))
        dup += len(got["seqs"]) - len(set(got["seqs"]))
        tokens_lost += TOKENS_PER_RUN - got["tokens"]
    lat = result["latencies_ms"]
    print(
        f"N={n:4d}: wall {wall:5.1f} s (ideal ~3.5 s), completed {completed}/{n}, "
        f"run time p50 {percentile(durations, 0.5):.1f} s p95 {percentile(durations, 0.95):.1f} s\n"
        f"        token→client p50 {percentile(lat, 0.5):.1f} ms p95 {percentile(lat, 0.95):.1f} ms "
        f"max {max(lat, default=float('nan')):.1f} ms ({len(lat)} tokens); "
        f"lost events {lost}, duplicates {dup}, answer tokens lost {tokens_lost}; "
        f"CPU per run: worker {cpu / n * 1000:.1f} ms (event loop {loop_cpu / n * 1000:.1f}, "
        f"ORM threads {(cpu - loop_cpu) / n * 1000:.1f}), web {web_cpu / n * 1000:.1f} ms, "
        f"harness (fake model + clients) {harness_cpu / n * 1000:.1f} ms; machine busy {busy / total * 100:.0f} %"
        + (f"; client errors {len(result['errors'])}: {result['errors'][:3]}" if result["errors"] else ""),
        flush=True,
    )
    if STAGES is not None:
        print("        in the worker: " + "; ".join(
            f"{name} p50 {percentile(xs, 0.5):.1f} p95 {percentile(xs, 0.95):.1f} ms" for name, xs in STAGES.items()
        ), flush=True)
        for xs in STAGES.values():
            xs.clear()
    if db is not None:
        print(db.report(n), flush=True)
    if timeline is not None:
        print("        CPU by process, % of one core per 250 ms (2 cores = 200 %):", flush=True)
        print("\n".join("        " + line for line in timeline.table().splitlines()), flush=True)
    return RoundResult(lat, lost, dup, tokens_lost)


def print_pooled(n: int, rounds: list[RoundResult]) -> None:
    """For an N run in several rounds: the token latency over every token of all of them, and
    how many rounds had their own p95 within :data:`TARGET_P95_MS`."""
    pooled = [x for r in rounds for x in r.latencies_ms]
    within = sum(percentile(r.latencies_ms, 0.95) <= TARGET_P95_MS for r in rounds)
    print(
        f"N={n:4d}, all {len(rounds)} rounds together: token→client p50 {percentile(pooled, 0.5):.1f} ms "
        f"p95 {percentile(pooled, 0.95):.1f} ms max {max(pooled, default=float('nan')):.1f} ms ({len(pooled)} tokens); "
        f"rounds with p95 ≤ {TARGET_P95_MS:g} ms: {within} of {len(rounds)}; lost events "
        f"{sum(r.lost for r in rounds)}, duplicates {sum(r.duplicates for r in rounds)}, "
        f"answer tokens lost {sum(r.tokens_lost for r in rounds)}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--profile", help="cProfile the worker's event loop into this file (last N only)")
    parser.add_argument("--switch-interval-ms", type=float,
                        help="sys.setswitchinterval for this (worker) process instead of RUN_HOST_SWITCH_INTERVAL_MS")
    parser.add_argument("--db-threads", type=int, help="RUN_HOST_DB_THREADS for this run (threads of the runner's ORM calls)")
    parser.add_argument("--pg-connections", type=int,
                        help="RUN_HOST_PG_CONNECTIONS for this run (the loop's async connections for per-turn statements)")
    parser.add_argument("--stages", action="store_true",
                        help="also print token latency at the runner, where its event is queued and where its reply is read")
    parser.add_argument("--warmup", type=int, default=5, help="runs of an unreported first round (0: none)")
    parser.add_argument("--timeline", action="store_true",
                        help="print each process group's CPU (worker, web, clients, model, Redis, PostgreSQL) "
                             "per 250 ms of the last round")
    parser.add_argument("--db", type=int, nargs="?", const=25, metavar="TOP",
                        help="also print PostgreSQL's CPU per run and turn (the whole cluster: a throwaway one tells "
                             "this benchmark's) and, if pg_stat_statements is loaded, its TOP statements per run")
    parser.add_argument("--analyze", action="store_true",
                        help="ANALYZE the run tables (as the owner) after creating each round's runs, so the round's "
                             "statements are planned for its rows: on a database the benchmarks emptied, statements "
                             "by id are sequential scans that read every run of the round (bench/README.md)")
    args = parser.parse_args()
    if args.db_threads:
        settings.RUN_HOST_DB_THREADS = args.db_threads
    if args.pg_connections:
        settings.RUN_HOST_PG_CONNECTIONS = args.pg_connections
    if args.stages:
        global STAGES
        STAGES = watch_stages()
    tune_interpreter_for_runs()  # as the worker's run host does (RUN_HOST_SWITCH_INTERVAL_MS)
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    print(f"channel layer prefix {settings.CHANNEL_LAYERS['default']['CONFIG'].get('prefix')}", file=sys.stderr)
    with fake_model("timed3") as base_url, BenchTenant(base_url, read_timeout_seconds=60.0) as bench:
        membership = membership_create(tenant=bench.tenant, user=bench.user)
        token = api_token_create(membership=membership).raw
        web = WebServer()
        try:
            if args.warmup:  # first connections, imports, pools: not part of any figure
                print(f"warm-up round ({args.warmup} runs):", flush=True)
                one_round(bench, token, web, base_url.pid, args.warmup, None, analyze_first=args.analyze)
            results: dict[int, list[RoundResult]] = {}
            for i, n in enumerate(args.n):
                last = i == len(args.n) - 1
                results.setdefault(n, []).append(
                    one_round(bench, token, web, base_url.pid, n, args.profile if last else None,
                              CpuTimeline(TIMELINE_GROUPS) if args.timeline and last else None,
                              DatabaseWatch(turns_per_run=TURNS_PER_RUN, top=args.db) if args.db is not None else None,
                              args.analyze))
            for n, rounds in results.items():
                if len(rounds) > 1:
                    print_pooled(n, rounds)
        finally:
            web.close()


if __name__ == "__main__":
    main()
