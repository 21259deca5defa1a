"""More than one machine's worth of processes on one machine: web, workers and beat apart (issue 40).

Starts the platform as separate processes, as production does, on a Celery queue of its own
(``RUNS_QUEUE`` and ``CELERY_QUEUE``, so neither ``make run``'s platform nor the tests see its
tasks): web processes (``python -m agent_platform.web``), Celery workers (``celery -A
sessions.tests.celery_test_app worker -l info --pool threads -Q <queue>``: the platform's app
plus the test tool ``test_echo`` the fake model calls) and, in the scaled-out layout, Celery
beat. Each worker carries ``WORKER_CONCURRENCY`` runs at once: N / workers by default (600 for
one worker, the production default 200 for three), so every layout carries all N at once;
``--worker-concurrency 200`` leaves one worker 400 runs queued (bench/README.md says what that
costs today). For each layout (default
``1x1``: 1 web + 1 worker, and ``2x3+beat``: 2 web + 3 workers + beat) it sends N runs at once
(default 600) through the web processes' REST API (``POST /api/v1/sessions/<id>/messages/``,
each web process in turn) and follows every session from seq 0, half over WebSocket and half
over SSE (``_scale_out_clients.py``, one process per kind), each web process carrying half of
each kind. Session i streams from web process i mod W and is posted to the next one, so
every event also crosses processes through Redis.

The fake model is ``concurrent_runs.py``'s (``timed3``, its own process): 3 turns (two tool
calls, then a 50-token answer streamed one token every 10 ms) with 1 s before each answer, so
a run needs ~3.5 s of model time. Printed per layout, with the definitions of
``concurrent_runs.py``:

- wall time from the first POST to the last run's end frame at a client, throughput (N / wall,
  runs/s), runs completed; POST → 201 and POST → end frame p50/p95;
- token → client p50/p95/max over every answer token (the client's receive time minus the
  time the fake model wrote it), and p95 by kind (WebSocket, SSE);
- lost events: seqs 1…last of each session (the last one its publisher handed out) never
  received, plus duplicates, plus answer tokens sent but not received;
- CPU per run (``/proc``, the round only) of the workers (sum), the web processes (sum), beat,
  Redis, PostgreSQL (the whole cluster on this host, reaped backends included: anything else
  using the cluster meanwhile counts too) and the harness (fake model, clients, the
  ``--probe`` listener, this process's POSTs); how busy the whole machine was (``/proc/stat``, all cores); the run tasks
  each worker received, and how many of them found their run already running or ended (a
  duplicate hand-off; their logs).

The runs belong to one throwaway tenant without a concurrent-run limit, as in
``concurrent_runs.py``; ``--tenants K`` spreads them over K such tenants, one user and API token
each (``--tenants N``: one run per tenant, so no run end finds its tenant's next runs queued
and hands them to the workers again; bench/README.md).

Goals (issue 40): token → client p95 ≤ 50 ms, 0 lost events. Each layout starts with an
unreported warm-up round (``--warmup`` runs per worker). Throttles on messages and runs, the
per-user stream limit and model-generated chat titles are off in the started processes (one
user posts every run; a title request would be one more model call per run, and its
``session_titled`` event would come after the end frame the clients stop at).

Every process it starts is in its own process group and stopped (SIGTERM, then SIGKILL) when
its layout ends or the script fails; the queue is deleted then.

Run: ``.venv/bin/python bench/scale_out.py [--n 600] [--layouts 1x1 2x3+beat] [--warmup 5]
[--worker-concurrency K] [--tenants K] [--post-concurrency K] [--no-analyze] [--keep-logs] [--timeline]
[--probe] [--gc-pauses | --loop-lag] [--rounds K] [--cgroups none|postgres|each|nested] [--equal-shares]``

``--timeline`` also prints, per second of each reported round, the tokens the fake model wrote
that second, their token → client p50/p95/max, and how many POSTs were answered: whether the
tail falls while the messages arrive or later; then, per second, the CPU of each group of
processes (workers, web, beat, PostgreSQL, Redis, the fake model, the clients, the probe, this
process's POSTs, the rest: ``_cpu_sampler.py`` reading ``/proc`` every 0.25 s).

``--probe`` also starts ``_live_probe.py``, one more process subscribed to every session's live
channel, and prints each token's latency split in three: model → the worker's event (its
``ts``), event → Redis subscriber (the worker's publish and Redis), model → client (the whole
path); what the whole adds to the second is the web process's and the client's share.

``--gc-pauses`` puts ``bench/gc_pauses`` on the started processes' ``PYTHONPATH`` (its
``sitecustomize`` logs every garbage collection of 20 ms or more) and prints, per web process
and worker, the collections that fell in the reported round: when, which generation, how long.

``--loop-lag`` puts ``bench/loop_lag`` there instead (one ``sitecustomize`` at a time: the two
options exclude each other). It times each web process's and worker's event loop with a 5 ms
timer and prints, per process, how often and how long the timer ran 10 ms or more late in the
round, and what the loop thread did meanwhile: waited for a core (Linux's runqueue wait),
ran callbacks (its own CPU), or neither, while the process's other threads used CPU.

``--cgroups`` decides how Linux schedules the processes as groups (bench/_cgroups.py; needs root
and PostgreSQL on this host). By default (``nested``) PostgreSQL's cluster, Redis and every
started process are each a CPU cgroup of their own, all under one parent, as Docker's cgroupfs
driver puts every container under ``/docker``: the layout docker-compose.yml declares. Each group
gets its Compose service's ``cpu_shares`` from docker-compose.yml (web and worker 2048, the rest
Docker's default 1024; ``--equal-shares``: all 1024). Where that is unavailable (not root), the
processes run as started and the first line printed says why. ``--cgroups each`` makes the same
groups side by side at the top of the hierarchy; ``--cgroups postgres`` puts only the cluster in
one; ``--cgroups none`` leaves every process as started. As started on a host with autogroups, a
cluster started by hand is one scheduling group per backend, each weighing as much as a whole web
process or worker; under one parent with equal weights, PostgreSQL's backends went ahead of the
workers. Both cost the p95 10–15 ms (bench/README.md, "PostgreSQL's backends, each a scheduling
group of its own" and "One parent over the platform, and the weights that undo it").

``--rounds K`` reports K rounds per layout on the same started processes (default 1), then
each layout's p95 over the rounds: all of them, the median and how many met the goal. The p95
of one round moves by tens of milliseconds from round to round on a shared 2-core machine
(bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

QUEUE = f"bench-scale-out-{uuid.uuid4().hex[:8]}"
# Before _harness loads the settings; every started process inherits this environment.
os.environ["RUNS_QUEUE"] = QUEUE
os.environ["CELERY_QUEUE"] = QUEUE  # beat's tasks and chat titles: to these workers only
os.environ.setdefault("OUTBOUND_ALLOWED_CIDRS", "127.0.0.0/8")  # the fake model is on loopback
os.environ.setdefault("STREAMS_PER_USER_MAX", "1000000")  # one user follows every session
for _scope in ("MESSAGES_USER", "MESSAGES_TENANT", "RUNS_USER", "RUNS_TENANT"):
    os.environ.setdefault(f"THROTTLE_{_scope}", "")  # empty: that throttle is off
os.environ.setdefault("CHAT_TITLES_FROM_MODEL", "0")

import aiohttp  # noqa: E402
from _cgroups import CgroupsUnavailable, CpuCgroups, compose_cpu_shares  # noqa: E402
from _harness import (  # noqa: E402
    ROOT,
    BenchTenant,
    CpuTimeline,
    cpu_seconds,
    fake_model,
    machine_busy_seconds,
    percentile,
)
from _pg_stats import analyze, postmaster_pid, server_cpu_seconds, server_pids  # noqa: E402
from _stats import machine  # noqa: E402

from sessions.services import chat_session_create  # noqa: E402
from tenants.scoping import tenant_scope  # noqa: E402
from tenants.services import api_token_create, membership_create  # noqa: E402

TOKENS_PER_RUN = 50
TARGET_P95_MS = 50.0
"""Issue 40's goal: token → client p95 at most this."""
PYTHON = str(ROOT / ".venv/bin/python")
WORKER_APP = "sessions.tests.celery_test_app"
"""The platform's Celery app plus the test-only tools (the fake model's runs call ``test_echo``)."""
CPU_GROUPS = {"celery_test_app worker": "workers", "agent_platform.web": "web", "agent_platform beat": "beat",
              "postgres": "postgres", "redis-server": "redis", "_fake_model": "model", "_scale_out_clients": "clients",
              "_live_probe": "probe"}
"""``--timeline``'s CPU per second: process groups by a substring of their command line
(:class:`_harness.CpuTimeline`; this process, which posts the messages, is ``POSTs``)."""
_TASK_RECEIVED = re.compile(rb"Task sessions\.run_execute\[[^\]]+\] received")
_EACH: CpuCgroups | None = None
"""``--cgroups each`` or ``nested``: where :func:`_place` puts every started process (None: nowhere)."""
_SHARES: dict[str, int] = {}
"""``--cgroups each`` or ``nested``: each Compose service's ``cpu_shares`` in docker-compose.yml (none with
``--equal-shares``)."""


def _place(group: str, pids: list[int]) -> None:
    """``--cgroups each`` or ``nested``: ``pids`` into the CPU cgroup ``group``, one of their
    own, weighted as docker-compose.yml weights its service (``web-1`` is ``web``'s)."""
    if _EACH is not None:
        _EACH.place(group, pids, shares=_SHARES.get(re.sub(r"-\d+$", "", group)))


class Child:
    """A platform process in its own process group, its output in ``<log_dir>/<name>.log``;
    the constructor returns once ``ready(self)`` is true (RuntimeError with the log's tail if
    the process exits or ``timeout`` seconds pass first)."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, ready: Callable[[Child], bool],
                 timeout: float = 90.0, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self.log.open("wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        _place(name, [self.proc.pid])
        deadline = time.monotonic() + timeout
        while not ready(self):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                stop_all([self])
                raise RuntimeError(f"{name} did not start:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)

    def logged(self, text: bytes) -> bool:
        return text in self.log.read_bytes()

    def cpu(self) -> float:
        """CPU seconds of the process so far (a worker with the threads pool is one process)."""
        return cpu_seconds(self.proc.pid)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to its process group, if it still runs."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


def stop_all(children: list[Child], grace: float = 20.0) -> None:
    """SIGTERM to every child's process group at once, SIGKILL to those still running after
    ``grace`` seconds (also if this is interrupted), then reap them."""
    try:
        for child in children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for child in children:
            child.signal(signal.SIGKILL)
            child.proc.wait(timeout=10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> Callable[[Child], bool]:
    import socket

    def check(_: Child) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    return check


@dataclass(frozen=True)
class Layout:
    """How many web and worker processes, and whether beat runs (``"2x3+beat"``)."""

    webs: int
    workers: int
    beat: bool

    @classmethod
    def parse(cls, text: str) -> Layout:
        match = re.fullmatch(r"(\d+)x(\d+)(\+beat)?", text)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: want WEBSxWORKERS[+beat], e.g. 2x3+beat")
        return cls(int(match[1]), int(match[2]), bool(match[3]))

    def __str__(self) -> str:
        return (f"{self.webs} web + {self.workers} worker{'s' if self.workers > 1 else ''}"
                + (" + beat" if self.beat else ""))


class Platform:
    """The processes of one :class:`Layout`, started in ``__enter__`` and all stopped on exit
    (also when one fails to start)."""

    def __init__(self, layout: Layout, log_dir: Path, worker_concurrency: int) -> None:
        self.layout = layout
        self.worker_concurrency = worker_concurrency
        self.log_dir = log_dir
        self.webs: list[Child] = []
        self.ports: list[int] = []
        self.workers: list[Child] = []
        self.beat: Child | None = None

    def __enter__(self) -> Platform:
        try:
            for i in range(self.layout.webs):
                port = _free_port()
                self.webs.append(Child(f"web-{i}", [PYTHON, "-m", "agent_platform.web", "--host", "127.0.0.1",
                                                    "--port", str(port), "--log-level", "warning"],
                                       self.log_dir, _listening(port)))
                self.ports.append(port)
            for i in range(self.layout.workers):
                self.workers.append(Child(
                    f"worker-{i}", [PYTHON, "-m", "celery", "-A", WORKER_APP, "worker", "-l", "info",
                                    "--pool", "threads", "-Q", QUEUE, "-n", f"w{i}-{QUEUE}@%h"],
                    self.log_dir, lambda c: c.logged(b"ready."),
                    env={"WORKER_CONCURRENCY": str(self.worker_concurrency)}))
            if self.layout.beat:
                self.beat = Child("beat", [PYTHON, "-m", "celery", "-A", "agent_platform", "beat", "-l", "info",
                                           "--schedule", str(self.log_dir / "celerybeat-schedule")],
                                  self.log_dir, lambda c: c.logged(b"beat: Starting"))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            _delete_queue()  # what is left in it: a stopping worker waits only for its running tasks
        finally:
            stop_all([*self.webs, *self.workers, *([self.beat] if self.beat else [])])
            _delete_queue()  # the tasks the workers had reserved, which they give back when they stop

    def run_tasks(self) -> tuple[list[int], int]:
        """Run tasks each worker has received so far, and how many of all those found their run
        not startable (already running or ended: a duplicate hand-off), from their logs."""
        logs = [w.log.read_bytes() for w in self.workers]
        return [len(_TASK_RECEIVED.findall(log)) for log in logs], sum(log.count(b"] not starting: ") for log in logs)


def _redis_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"redis-server"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@dataclass
class Cpu:
    """A reading of every CPU figure the round reports (seconds)."""

    workers: float
    webs: float
    beat: float
    redis: float
    postgres: float
    harness: float
    busy: float
    total: float

    @classmethod
    def read(cls, platform: Platform, harness_pids: list[int], postmaster: int | None) -> Cpu:
        busy, total = machine_busy_seconds()
        return cls(
            workers=sum(w.cpu() for w in platform.workers), webs=sum(w.cpu() for w in platform.webs),
            beat=platform.beat.cpu() if platform.beat else 0.0,
            redis=sum(cpu_seconds(p) for p in _redis_pids()),
            postgres=server_cpu_seconds(postmaster) if postmaster else float("nan"),
            harness=sum(cpu_seconds(p) for p in harness_pids) + time.process_time(), busy=busy, total=total,
        )

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})


def _new_session(bench: BenchTenant) -> int:
    from agent_platform.redis_clients import sync_redis
    from sessions.events import session_keys

    with tenant_scope(bench.tenant.pk):
        session = chat_session_create(user=bench.user, agent=bench.agent)
        sync_redis().delete(*session_keys(session.pk))  # an earlier database's events under this id
        return session.pk


def _last_seqs(session_ids: list[int]) -> dict[int, int]:
    from agent_platform.redis_clients import sync_redis
    from sessions.events import session_keys

    pipe = sync_redis().pipeline()
    for sid in session_ids:
        pipe.get(session_keys(sid)[0])
    return {sid: int(v or 0) for sid, v in zip(session_ids, pipe.execute(), strict=True)}


async def _post_all(posts: list[tuple[int, str, str]], limit: int) -> list[tuple[int, float, int, float, str]]:
    """POST one message to each ``(session id, "host:port", API token)`` at once (at most
    ``limit`` in flight; 0: no limit): ``[(session id, sent at (epoch s), status, ms, error body)]``."""
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=timeout) as http:
        async def one(sid: int, base: str, token: str) -> tuple[int, float, int, float, str]:
            sent = time.time()
            try:
                async with http.post(f"http://{base}/api/v1/sessions/{sid}/messages/", json={"content": "go"},
                                     headers={"Authorization": f"Bearer {token}"}) as resp:
                    body = await resp.text()
                    return sid, sent, resp.status, (time.time() - sent) * 1000, "" if resp.status == 201 else body[:200]
            except Exception as exc:  # reported with the round's figures
                return sid, sent, 0, (time.time() - sent) * 1000, f"{type(exc).__name__}: {exc}"

        return await asyncio.gather(*(one(*post) for post in posts))


class Clients:
    """One ``_scale_out_clients.py`` process per stream kind, each following its sessions."""

    def __init__(self, follow: list[dict]) -> None:
        self.procs = []
        for kind in ("ws", "sse"):
            mine = [f for f in follow if f["kind"] == kind]
            if not mine:
                continue
            proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_scale_out_clients.py"))],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
            _place(f"clients-{kind}", [proc.pid])
            proc.stdin.write(json.dumps({"follow": mine, "timeout": 300}) + "\n")
            proc.stdin.flush()
            self.procs.append(proc)
        for proc in self.procs:
            if proc.stdout.readline().strip() != "ready":
                self.close()
                raise RuntimeError("the event-stream clients did not connect")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def results(self) -> dict:
        """Every client process's report, merged (blocks until each is done)."""
        merged: dict = {"latencies_ms": {"ws": [], "sse": []}, "written_at": {"ws": [], "sse": []}, "sessions": {},
                        "errors": []}
        for proc in self.procs:
            out = json.loads(proc.stdout.readline())
            for key in ("latencies_ms", "written_at"):
                for kind, xs in out[key].items():
                    merged[key][kind] += xs
            merged["sessions"].update(out["sessions"])
            merged["errors"] += out["errors"]
        return merged

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class LiveProbe:
    """``--probe``: a ``_live_probe.py`` process listening to every session's live channel."""

    def __init__(self) -> None:
        from django.conf import settings

        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_live_probe.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        _place("probe", [self.proc.pid])
        self.proc.stdin.write(json.dumps({"redis": settings.REDIS_URL,
                                          "pattern": f"{settings.REDIS_KEY_PREFIX}:session:*:live"}) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the live-channel probe did not subscribe")

    def results(self) -> dict:
        """Stops the probe; its report (see ``_live_probe.py``)."""
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def print_probe(total_ms: list[float], probe: dict) -> None:
    """``--probe``: token → client split at the worker's event and at Redis's ``PUBLISH``."""
    def figures(xs: list[float]) -> str:
        return f"p50 {percentile(xs, 0.5):.1f} ms p95 {percentile(xs, 0.95):.1f} ms max {max(xs, default=float('nan')):.1f} ms"

    to_redis = probe["latencies_ms"]
    publish = [a - b for a, b in zip(to_redis, probe["to_event_ms"], strict=True)]
    print(f"    split (--probe, {len(to_redis)} tokens): model → worker's event {figures(probe['to_event_ms'])}; "
          f"event → Redis subscriber {figures(publish)}; model → Redis subscriber {figures(to_redis)}; "
          f"model → client {figures(total_ms)}", flush=True)


_GC_PAUSE = re.compile(rb"GCPAUSE pid=\d+ at=([\d.]+) gen=(\d) ms=([\d.]+)")
_LOOP_LAG = re.compile(rb"LOOPLAG pid=\d+ at=([\d.]+) late=([\d.]+) span=([\d.]+) cpu=([\d.]+) runqueue=([\d.na]+) "
                       rb"others=(-?[\d.]+)")


def print_gc_pauses(platform: Platform, start: float, end: float) -> None:
    """``--gc-pauses``: each web process's and worker's garbage collections of 20 ms or more
    between ``start`` and ``end`` (epoch seconds), from their logs."""
    lines = []
    for child in [*platform.webs, *platform.workers]:
        pauses = [(float(at) - start, int(gen), float(ms)) for at, gen, ms in _GC_PAUSE.findall(child.log.read_bytes())
                  if start <= float(at) <= end]
        if pauses:
            lines.append(f"{child.name}: " + ", ".join(f"{ms:.0f} ms (gen {gen}, second {at:.1f})"
                                                       for at, gen, ms in pauses))
    print("    collections ≥ 20 ms in the round: " + ("; ".join(lines) if lines else "none"), flush=True)


def print_loop_lag(platform: Platform, start: float, end: float) -> None:
    """``--loop-lag``: per web process and worker, its loop's late timers between ``start`` and
    ``end`` (epoch seconds), from their logs (bench/loop_lag/sitecustomize.py): how many, their
    lateness in all and at most, and over those timers' spans the loop thread's runqueue wait,
    its own CPU and the CPU of the process's other threads."""
    print("    late loop timers (≥ 10 ms) in the round; over their spans, the loop thread's runqueue wait / "
          "own CPU / the other threads' CPU:", flush=True)
    for child in [*platform.webs, *platform.workers]:
        rows = [tuple(map(float, row)) for row in _LOOP_LAG.findall(child.log.read_bytes())
                if start <= float(row[0]) <= end]
        if not rows:
            print(f"    {child.name}: none", flush=True)
            continue
        late, span, cpu, runqueue, others = (sum(row[i] for row in rows) for i in range(1, 6))
        print(f"    {child.name}: {len(rows)} late, {late:.0f} ms in all (max {max(row[1] for row in rows):.0f} ms); "
              f"spans {span:.0f} ms: runqueue {runqueue:.0f} ms ({runqueue / span * 100:.0f} %), own CPU {cpu:.0f} ms "
              f"({cpu / span * 100:.0f} %), other threads {others:.0f} ms", flush=True)


@dataclass
class RoundResult:
    """One layout's figures at one N."""

    layout: Layout
    n: int
    wall: float
    completed: int
    p95_ms: float
    lost: int


def _lost(sessions: list[int], got: dict) -> tuple[int, int, int]:
    last = _last_seqs(sessions)
    missing = dup = tokens = 0
    for sid in sessions:
        rec = got.get(str(sid), {"seqs": [], "tokens": 0})
        missing += len(set(range(1, last[sid] + 1)) - set(rec["seqs"]))
        dup += len(rec["seqs"]) - len(set(rec["seqs"]))
        tokens += TOKENS_PER_RUN - rec["tokens"]
    return missing, dup, tokens


def print_timeline(started: float, result: dict, posted: list[tuple[int, float, int, float, str]],
                   probe: dict | None = None) -> None:
    """``--timeline``: per second of the round (by when the fake model wrote the token), the
    tokens written, their latency to the client p50/p95/max, and the POSTs answered that second;
    with ``--probe`` also the p95/max of their latency to the Redis subscriber (the worker's half)."""
    by_second: dict[int, list[float]] = {}
    for kind in ("ws", "sse"):
        for written, ms in zip(result["written_at"][kind], result["latencies_ms"][kind], strict=True):
            by_second.setdefault(int(written - started), []).append(ms)
    answered: dict[int, int] = {}
    for _, sent, _, ms, _ in posted:
        second = int(sent + ms / 1000 - started)
        answered[second] = answered.get(second, 0) + 1
    to_redis: dict[int, list[float]] = {}
    if probe is not None:
        for written, ms in zip(probe["written_at"], probe["latencies_ms"], strict=True):
            to_redis.setdefault(int(written - started), []).append(ms)
    print(f"    (second 0 began at {started:.3f}, seconds since the epoch)", flush=True)
    print("    second  tokens  p50 ms  p95 ms  max ms  POSTs answered"
          + ("  to Redis p95 ms  max ms" if probe is not None else ""), flush=True)
    for second in range(max([*by_second, *answered], default=-1) + 1):
        lat = by_second.get(second, [])
        figures = (f"{percentile(lat, 0.5):6.0f}  {percentile(lat, 0.95):6.0f}  {max(lat):6.0f}" if lat
                   else "     –       –       –")
        line = f"    {second:6d}  {len(lat):6d}  {figures}  {answered.get(second, 0):14d}"
        if probe is not None:
            half = to_redis.get(second, [])
            line += (f"  {percentile(half, 0.95):15.0f}  {max(half):6.0f}" if half else "                –       –")
        print(line, flush=True)


def print_cpu_timeline(timeline: CpuTimeline, start: float) -> None:
    """``--timeline``: per second of the round (second 0 as in :func:`print_timeline`), the CPU
    each group of processes used (% of one core; the machine has ``os.cpu_count()`` of them):
    whether a second's tail came with every core busy, and with which processes."""
    print(f"    CPU per second, % of one core ({os.cpu_count()} cores; sampled every {timeline.interval:g} s):",
          flush=True)
    print("    second" + "".join(f"{name:>9}" for name in timeline.names) + "    total", flush=True)
    for at, cores in timeline.bins(1.0, start=start):
        print(f"    {int(at):6d}" + "".join(f"{cores[name] * 100:8.0f}%" for name in timeline.names)
              + f"{sum(cores.values()) * 100:8.0f}%", flush=True)


def one_round(accounts: list[tuple[BenchTenant, str]], platform: Platform, model_pid: int, n: int, *, report: bool,
              post_limit: int, analyze_first: bool, timeline: bool = False, probe: bool = False,
              gc_pauses: bool = False, loop_lag: bool = False) -> RoundResult:
    """N runs at once on ``platform``, session i in ``accounts[i mod K]`` (a tenant and its API
    token); prints the figures if ``report``."""
    webs = [f"127.0.0.1:{p}" for p in platform.ports]
    tokens = [accounts[i % len(accounts)][1] for i in range(n)]
    sessions = [_new_session(accounts[i % len(accounts)][0]) for i in range(n)]
    if analyze_first:
        analyze()  # the round's sessions in the statistics (concurrent_runs.py --analyze)
    w = len(webs)
    follow = [{"session": sid, "base": webs[i % w], "kind": "ws" if (i // w) % 2 == 0 else "sse", "token": tokens[i]}
              for i, sid in enumerate(sessions)]
    posts = [(sid, webs[(i + 1) % w], tokens[i]) for i, sid in enumerate(sessions)]
    clients = Clients(follow)
    live_probe, probe_result = None, None
    cpu_timeline = CpuTimeline(CPU_GROUPS, interval=0.25, own="POSTs") if timeline and report else None
    try:
        if cpu_timeline is not None:
            cpu_timeline.start()
        live_probe = LiveProbe() if probe else None
        harness = [model_pid, *clients.pids, *([live_probe.proc.pid] if live_probe is not None else [])]
        postmaster = postmaster_pid()
        taken, refused = platform.run_tasks()
        before = Cpu.read(platform, harness, postmaster)
        started, started_monotonic = time.time(), time.perf_counter()
        posted = asyncio.run(_post_all(posts, post_limit))
        result = clients.results()
        cpu = Cpu.read(platform, harness, postmaster) - before
        if cpu_timeline is not None:
            cpu_timeline.stop()
        if live_probe is not None:
            probe_result = live_probe.results()
    finally:
        clients.close()
        if live_probe is not None:
            live_probe.close()
        if cpu_timeline is not None:
            cpu_timeline.stop()  # (stopped already unless the round failed)
    taken_now, refused_now = platform.run_tasks()
    taken = [after - then for after, then in zip(taken_now, taken, strict=True)]
    refused = refused_now - refused
    ended = [rec["ended_at"] for rec in result["sessions"].values() if rec["ended_at"]]
    completed = sum(rec["end"] == "run_completed" for rec in result["sessions"].values())
    wall = max(ended) - started if len(ended) == n else float("nan")
    sent_at = {sid: sent for sid, sent, *_ in posted}
    run_s = [rec["ended_at"] - sent_at[int(sid)] for sid, rec in result["sessions"].items() if rec["ended_at"]]
    post_ms = [ms for _, _, status, ms, _ in posted if status == 201]
    post_errors = [f"{status} {body}" for _, _, status, _, body in posted if status != 201]
    missing, dup, tokens_lost = _lost(sessions, result["sessions"])
    lat = result["latencies_ms"]["ws"] + result["latencies_ms"]["sse"]
    p95 = percentile(lat, 0.95)
    if report:
        def per_run(seconds: float) -> str:
            return f"{seconds / n * 1000:.1f} ms"

        print(
            f"{platform.layout} (WORKER_CONCURRENCY {platform.worker_concurrency}), N={n}: wall {wall:.1f} s, throughput {n / wall:.1f} runs/s, completed "
            f"{completed}/{n} (ended {len(ended)}); POST → 201 p50 {percentile(post_ms, 0.5):.0f} ms p95 {percentile(post_ms, 0.95):.0f} ms; "
            f"POST → end frame p50 {percentile(run_s, 0.5):.1f} s p95 {percentile(run_s, 0.95):.1f} s\n"
            f"    token→client p50 {percentile(lat, 0.5):.1f} ms p95 {p95:.1f} ms max {max(lat, default=float('nan')):.1f} ms "
            f"({len(lat)} tokens; p95 WebSocket {percentile(result['latencies_ms']['ws'], 0.95):.1f} ms, "
            f"SSE {percentile(result['latencies_ms']['sse'], 0.95):.1f} ms)\n"
            f"    lost events {missing + dup + tokens_lost} (missing seqs {missing}, duplicates {dup}, "
            f"answer tokens lost {tokens_lost})\n"
            f"    CPU per run: workers {per_run(cpu.workers)} (run tasks received {'/'.join(map(str, taken))}, "
            f"{refused} of them for a run already running or ended), "
            f"web {per_run(cpu.webs)}" + (f", beat {per_run(cpu.beat)}" if platform.beat else "")
            + f", Redis {per_run(cpu.redis)}, PostgreSQL {per_run(cpu.postgres)}, harness {per_run(cpu.harness)}; "
            f"machine busy {cpu.busy / cpu.total * 100:.0f} %"
            + (f"\n    POST errors {len(post_errors)}: {post_errors[:3]}" if post_errors else "")
            + (f"\n    client errors {len(result['errors'])}: {result['errors'][:3]}" if result["errors"] else ""),
            flush=True,
        )
        if probe_result is not None:
            print_probe(lat, probe_result)
        if gc_pauses:
            print_gc_pauses(platform, started, started + wall if wall == wall else time.time())
        if loop_lag:
            print_loop_lag(platform, started, started + wall if wall == wall else time.time())
        if timeline:
            print_timeline(started, result, posted, probe_result)
            if cpu_timeline is not None:
                print_cpu_timeline(cpu_timeline, started_monotonic)
    return RoundResult(platform.layout, n, wall, completed, p95, missing + dup + tokens_lost)


def _delete_queue() -> None:
    """Delete the benchmark's queue and kombu's bindings of it from the broker."""
    from agent_platform.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.queue_delete(QUEUE)
        channel.client.delete(f"_kombu.binding.{QUEUE}", f"_kombu.binding_permanent.{QUEUE}")


def _cgroups(mode: str, *, equal_shares: bool, cleanup: contextlib.ExitStack) -> CpuCgroups:
    """``--cgroups postgres|each|nested``: PostgreSQL's cluster in a CPU cgroup of its own (under
    one parent for ``nested``), weighted as docker-compose.yml weights its services unless
    ``equal_shares`` (``each`` and ``nested`` only); the groups are undone when ``cleanup`` closes.

    Raises:
        CgroupsUnavailable: PostgreSQL does not run on this host, or no writable CPU cgroups.
    """
    postmaster = postmaster_pid()
    if postmaster is None:
        raise CgroupsUnavailable("PostgreSQL does not run on this host")
    if mode != "postgres" and not equal_shares:
        _SHARES.update(compose_cpu_shares(ROOT / "docker-compose.yml"))
    groups = CpuCgroups(QUEUE, parent=QUEUE if mode == "nested" else None)
    cleanup.callback(groups.close)
    groups.place("postgres", server_pids(postmaster),  # the postmaster first: what it starts follows
                 shares=_SHARES.get("postgres"))
    return groups


def _scheduling(groups: CpuCgroups | None) -> str:
    """How this host's scheduler groups the processes (printed with the machine)."""
    autogroups = Path("/proc/sys/kernel/sched_autogroup_enabled")
    on = autogroups.exists() and autogroups.read_text().strip() == "1"
    if groups is None:
        postgres = "as started" + (" (autogroups: every backend a group of its own)" if on else "")
    else:
        postgres = f"in one CPU cgroup ({groups.path('postgres')})"
        if _EACH is not None:
            postgres += ", every other process in one of its own"
            if groups.parent is not None:
                postgres += f", all under {groups.parent}"
            postgres += "; cpu_shares " + (", ".join(f"{k} {v}" for k, v in _SHARES.items()) or "all 1024")
    return f"autogroups {'on' if on else 'off'}; PostgreSQL {postgres}"


def _layouts(args: argparse.Namespace, tmp: str) -> list[RoundResult]:
    """Every layout's rounds (``main``'s options), the processes' logs under ``tmp``."""
    results: list[RoundResult] = []
    with fake_model("timed3") as base_url, contextlib.ExitStack() as tenants:
        _place("model", [base_url.pid])
        accounts = []
        for _ in range(args.tenants):
            bench = tenants.enter_context(BenchTenant(base_url, read_timeout_seconds=60.0))
            accounts.append((bench, api_token_create(membership=membership_create(tenant=bench.tenant,
                                                                                   user=bench.user)).raw))
        try:
            for layout in args.layouts:
                log_dir = Path(tmp) / str(len(results))
                log_dir.mkdir()
                concurrency = args.worker_concurrency or -(-args.n // layout.workers)
                with Platform(layout, log_dir, concurrency) as platform:
                    if args.warmup:
                        one_round(accounts, platform, base_url.pid, args.warmup * layout.workers, report=False,
                                  post_limit=args.post_concurrency, analyze_first=False)
                    for _ in range(args.rounds):
                        results.append(one_round(accounts, platform, base_url.pid, args.n, report=True,
                                                 post_limit=args.post_concurrency, analyze_first=args.analyze,
                                                 timeline=args.timeline, probe=args.probe, gc_pauses=args.gc_pauses,
                                                 loop_lag=args.loop_lag))
        finally:
            _delete_queue()
            if args.keep_logs:
                print(f"logs in {tmp}", flush=True)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600, help="runs at once per layout (default 600)")
    parser.add_argument("--layouts", type=Layout.parse, nargs="+",
                        default=[Layout.parse("1x1"), Layout.parse("2x3+beat")],
                        help="WEBSxWORKERS[+beat] each (default: 1x1 2x3+beat)")
    parser.add_argument("--warmup", type=int, default=5, help="runs per worker of each layout's unreported first round")
    parser.add_argument("--post-concurrency", type=int, default=0, help="POSTs in flight at most (0: all at once)")
    parser.add_argument("--no-analyze", dest="analyze", action="store_false",
                        help="do not ANALYZE the run tables after creating each round's sessions")
    parser.add_argument("--worker-concurrency", type=int, default=0,
                        help="WORKER_CONCURRENCY of each worker (default: N / workers, rounded up: every layout "
                             "carries all N runs at once)")
    parser.add_argument("--tenants", type=int, default=1,
                        help="spread the runs over this many throwaway tenants (each one user, one API token, one "
                             "agent, no concurrent-run limit); default 1, as concurrent_runs.py")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (the path is printed)")
    parser.add_argument("--timeline", action="store_true",
                        help="also print each reported round's token latency and POSTs answered second by second")
    parser.add_argument("--probe", action="store_true",
                        help="also listen to every live channel (_live_probe.py) and print where each token's "
                             "latency falls: model → worker's event, → Redis subscriber, → client")
    parser.add_argument("--gc-pauses", action="store_true",
                        help="log the started processes' garbage collections of 20 ms or more (bench/gc_pauses) and "
                             "print those of each reported round")
    parser.add_argument("--loop-lag", action="store_true",
                        help="time the started processes' event loops (bench/loop_lag) and print, per process, its "
                             "late timers in each reported round and what its loop thread did meanwhile")
    parser.add_argument("--rounds", type=int, default=1,
                        help="reported rounds per layout, on the same started processes (default 1)")
    parser.add_argument("--cgroups", choices=["none", "postgres", "each", "nested"],
                        help="nested (the default where it can: root and PostgreSQL on this host): PostgreSQL, "
                             "Redis and every started process each in a CPU cgroup of its own, all under one "
                             "parent, as docker-compose.yml's services run under Docker; each: the same groups "
                             "side by side; postgres: only PostgreSQL's cluster as one group; none: every process "
                             "as started (bench/_cgroups.py). With each and nested, every group gets its "
                             "service's cpu_shares from docker-compose.yml")
    parser.add_argument("--equal-shares", action="store_true",
                        help="--cgroups: every group at the default weight (1024), not docker-compose.yml's")
    args = parser.parse_args()
    if args.gc_pauses and args.loop_lag:
        parser.error("--gc-pauses and --loop-lag each need their own sitecustomize: give one of them")
    if args.equal_shares and args.cgroups not in (None, "each", "nested"):
        parser.error("--equal-shares goes with --cgroups each or nested")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    hook = "gc_pauses" if args.gc_pauses else "loop_lag" if args.loop_lag else None
    if hook is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).with_name(hook)), *filter(None, [os.environ.get("PYTHONPATH")])])
    global _EACH
    groups, unavailable, mode = None, "", args.cgroups or "nested"
    with contextlib.ExitStack() as cleanup:
        if mode != "none":
            try:
                groups = _cgroups(mode, equal_shares=args.equal_shares, cleanup=cleanup)
            except CgroupsUnavailable as exc:
                if args.cgroups is not None:
                    parser.error(f"--cgroups: {exc}")
                unavailable = f" (--cgroups nested, the default, unavailable: {exc})"
            if groups is not None and mode in ("each", "nested"):
                _EACH = groups
                _place("redis", _redis_pids())
        print(f"{machine()}; load average {os.getloadavg()[0]:.1f}; queue {QUEUE}; {_scheduling(groups)}{unavailable}",
              flush=True)
        tmp = tempfile.mkdtemp(prefix="scale-out-")
        results = _layouts(args, tmp)
    base = results[0]
    for r in results:
        print(f"{r.layout}: {r.n / r.wall:.1f} runs/s ({r.n / r.wall / (base.n / base.wall):.2f}× {base.layout}); "
              f"token→client p95 {r.p95_ms:.1f} ms (goal ≤ {TARGET_P95_MS:g}: {'met' if r.p95_ms <= TARGET_P95_MS else 'missed'}); "
              f"lost {r.lost} (goal 0: {'met' if r.lost == 0 else 'missed'}); completed {r.completed}/{r.n}", flush=True)
    if args.rounds > 1:
        for layout in args.layouts:
            print(rounds_summary([r for r in results if r.layout == layout]), flush=True)


def rounds_summary(rounds: list[RoundResult]) -> str:
    """``--rounds``: one layout's rounds in a line: each round's p95 in order, their median, how
    many met :data:`TARGET_P95_MS`, and the throughput's range."""
    p95s = [r.p95_ms for r in rounds]
    rates = [r.n / r.wall for r in rounds]
    met = sum(p95 <= TARGET_P95_MS for p95 in p95s)
    return (f"{rounds[0].layout}, {len(rounds)} rounds: token→client p95 {', '.join(f'{p:.1f}' for p in p95s)} ms; "
            f"median {percentile(p95s, 0.5):.1f} ms; {met} of {len(rounds)} met the goal (≤ {TARGET_P95_MS:g} ms); "
            f"throughput {min(rates):.1f}–{max(rates):.1f} runs/s; lost {sum(r.lost for r in rounds)}")


if __name__ == "__main__":
    main()
