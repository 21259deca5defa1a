"""Shared set-up for benchmarks: Django on the development database, a throwaway tenant,
runs created through the real services and executed by the real runner."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")
os.environ.setdefault("REDIS_KEY_PREFIX", "apbench")
os.environ.setdefault("LOG_LEVEL", "WARNING")
# The benches' fake model servers listen on loopback, which the outbound address rules refuse
# unless allowed (every run would fail model_unavailable).
os.environ.setdefault("OUTBOUND_ALLOWED_CIDRS", "127.0.0.0/8")
# Production settings unless told otherwise: with DEBUG on, Django's cursor wrapper formats
# and keeps every SQL statement, which costs a busy worker ~10 % of its CPU. Throwaway keys:
# a benchmark's tenant and its secrets live only as long as the benchmark.
if os.environ.setdefault("DEBUG", "0") == "0":
    os.environ.setdefault("SECRET_KEY", "bench-" + uuid.uuid4().hex)
    os.environ.setdefault("ENCRYPTION_KEY", "YmVuY2gtb25seS10aHJvd2F3YXktbWFzdGVyLWtleSE=")

import django  # noqa: E402

django.setup()

from _cpu_sampler import stat_cpu_seconds  # noqa: E402
from _stats import percentile  # noqa: E402,F401  (re-exported for the benchmarks)
from django.contrib.auth import get_user_model  # noqa: E402

import sessions.tasks  # noqa: E402
import sessions.tests.tools_for_tests  # noqa: E402,F401  (registers test_echo)
from agents.tests.factories import agent_with_route, bind_builtin  # noqa: E402
from sessions.services import chat_session_create, message_post  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.scoping import system_scope, tenant_scope  # noqa: E402
from tenants.services import tenant_create  # noqa: E402

sessions.tasks.run_enqueue = lambda run_id, tenant_id=None: None  # the benchmark executes runs itself

# A benchmark is an operator's script across its own throwaway tenants, like a management
# command: the database shows it every tenant's rows (tenants/rls.py). The code it measures
# narrows the scope itself (the runner works in its run's tenant), as in production.
_SCRIPT_SCOPE = system_scope()
_SCRIPT_SCOPE.__enter__()


class BenchTenant:
    """A tenant with one agent on ``base_url`` (bound to test_echo); deleted on exit."""

    def __init__(self, base_url: str, **agent_fields):
        slug = f"bench-{uuid.uuid4().hex[:8]}"
        self.tenant = tenant_create(name=slug, slug=slug)
        # Benchmarks measure how many runs one worker carries, not the tenant's limit
        # (RUNS_PER_TENANT_DEFAULT, 50), which would keep the rest queued.
        self.tenant.max_concurrent_runs = 100_000
        self.tenant.save(update_fields=["max_concurrent_runs"])
        self.user = get_user_model().objects.create_user(username=slug)
        self.agent = agent_with_route(tenant=self.tenant, base_urls=[base_url], **agent_fields)
        bind_builtin(self.agent, "test_echo")

    def new_run(self, content: str = "go"):
        from agent_platform.redis_clients import sync_redis
        from sessions.events import session_keys

        with tenant_scope(self.tenant.pk):
            session = chat_session_create(user=self.user, agent=self.agent)
            # Session ids repeat across databases (another DATABASE_URL, a reset one): drop
            # whatever an earlier benchmark left under this id so replays start empty.
            sync_redis().delete(*session_keys(session.pk))
            return message_post(session=session, user=self.user, content=content)

    def __enter__(self) -> BenchTenant:
        return self

    def __exit__(self, *exc) -> None:
        self.user.delete()  # its sessions and runs go with it
        Tenant.objects.filter(pk=self.tenant.pk).delete()


class ModelURL(str):
    """A fake model's base URL that also names its process (``pid``), for CPU figures."""

    pid: int


@contextlib.contextmanager
def fake_model(responder: str):
    """A FakeLLMServer in a child process (see _fake_model.py); yields its base URL (a
    :class:`ModelURL`)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("_fake_model.py")), responder],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = ModelURL(proc.stdout.readline().strip())
        url.pid = proc.pid
        yield url
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def cpu_seconds(pid: int, task: int | None = None) -> float:
    """utime + stime of a process, or of one of its threads (Linux /proc), seconds. A child
    that has exited but not been waited for still has its figures."""
    return stat_cpu_seconds(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat")


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (``/proc/stat``);
    the difference of two readings tells how saturated the machine was in between."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


class CpuTimeline:
    """Every process's CPU time, sampled every ``interval`` seconds between :meth:`start` and
    :meth:`stop` by a child process (``bench/_cpu_sampler.py``: the sampling costs the measured
    processes nothing), and, per ``bin_seconds``, how many cores each group of processes used:
    this process (``own``, default ``worker``), and the others by a substring of their command
    line (``groups``: ``{substring: name}``, first match; the rest is ``other``). Shows which
    process a saturated machine was busy with, and when.
    """

    def __init__(self, groups: dict[str, str], *, interval: float = 0.05, own: str = "worker") -> None:
        self.groups = groups
        self.interval = interval
        self.own = own
        self.names = [own, *dict.fromkeys(groups.values()), "other"]
        self._proc: subprocess.Popen | None = None
        self._result: dict = {"samples": [], "commands": {}}

    def start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_cpu_sampler.py")),
                                       str(self.interval)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def stop(self) -> None:
        if self._proc is None:
            return
        out, _ = self._proc.communicate(timeout=60)  # closes its stdin: it takes a last sample and reports
        self._result = json.loads(out)
        self._proc = None

    def _kind(self, pid: str) -> str:
        if pid == str(os.getpid()):
            return self.own
        command = self._result["commands"].get(pid, "")
        if "_cpu_sampler.py" in command:
            return "sampler"
        return next((name for key, name in self.groups.items() if key in command), "other")

    def bins(self, bin_seconds: float = 0.25, *, start: float | None = None) -> list[tuple[float, dict[str, float]]]:
        """``[(bin start, seconds since start; {group: cores used})]``, in time order (the
        sampler's own CPU is left out). ``start``: a ``time.perf_counter()`` reading of any
        process (CLOCK_MONOTONIC: one clock for the whole machine) where bin 0 begins; default
        the first sample. Samples before it are left out."""
        samples = self._result["samples"]
        if start is not None:
            samples = [sample for sample in samples if sample[0] >= start]
        if len(samples) < 2:
            return []
        start = samples[0][0] if start is None else start
        kinds: dict[str, str] = {}
        used: dict[int, dict[str, float]] = {}
        spans: dict[int, float] = {}
        for (t0, before), (t1, after) in zip(samples, samples[1:], strict=False):
            b = int((t0 - start) / bin_seconds)
            acc = used.setdefault(b, dict.fromkeys(self.names, 0.0))
            spans[b] = spans.get(b, 0.0) + (t1 - t0)
            for pid, seconds in after.items():
                if pid in before:
                    kind = kinds.get(pid) or kinds.setdefault(pid, self._kind(pid))
                    if kind != "sampler":
                        acc[kind] += seconds - before[pid]
        return [(b * bin_seconds, {k: v / spans[b] for k, v in used[b].items()}) for b in sorted(used)]

    def table(self, bin_seconds: float = 0.25) -> str:
        """:meth:`bins` as text: one line per bin, % of one core per group, and the total."""
        lines = ["   t (s) " + "".join(f"{name:>9}" for name in self.names) + "    total"]
        for at, cores in self.bins(bin_seconds):
            lines.append(f"{at:8.2f} " + "".join(f"{cores[n] * 100:8.0f}%" for n in self.names)
                         + f"{sum(cores.values()) * 100:8.0f}%")
        return "\n".join(lines)


def summary(values_ms: list[float]) -> str:
    return (f"n={len(values_ms)} p50={percentile(values_ms, 0.5):.1f} ms p95={percentile(values_ms, 0.95):.1f} ms "
            f"mean={statistics.fmean(values_ms):.1f} ms")
