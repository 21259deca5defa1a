"""Set-up shared by the entry-point benchmarks (``door_overhead.py``, ``openai_stream_fanout.py``):
the platform as production runs it, in three processes of its own, with one throwaway tenant.

- the fake model (``bench/_fake_model.py``, its own process);
- the web process (``python -m agent_platform.web``: uvicorn with the project's ASGI app, which
  serves the native API, ``/api/openai/v1``, ``/mcp/agents/`` and ``/a2a/``);
- a Celery worker (``celery -A agent_platform worker --pool threads``, as ``make run`` starts it)
  on a queue of its own (``CELERY_QUEUE``), so another engineer's worker never takes this
  benchmark's runs and this one never takes theirs.

A run posted through any entry point is handed to the worker by the web process (on commit),
exactly as in production; the benchmark reads each process's CPU time from ``/proc``.

Import this module before anything that loads Django's settings: it sets the environment the
three processes share (limits a benchmark would hit, no title requests to the fake model).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

# Before the settings load (this process's and, inherited, the web process's and the worker's).
os.environ.setdefault("OUTBOUND_ALLOWED_CIDRS", "127.0.0.0/8")  # the fake model listens on loopback
os.environ.setdefault("STREAMS_PER_USER_MAX", "1000000")  # one user holds every benchmark stream
for _scope in ("MESSAGES", "RUNS"):  # counted as in production, never refused
    os.environ.setdefault(f"THROTTLE_{_scope}_USER", "100000000/minute")
    os.environ.setdefault(f"THROTTLE_{_scope}_TENANT", "100000000/minute")
# A chat's first answer would send a title request to the fake model (another model call on the
# worker, the same for every entry point): off, so the worker's CPU is the run's.
os.environ.setdefault("CHAT_TITLES_FROM_MODEL", "0")
_RUN_TAG = uuid.uuid4().hex[:8]
os.environ.setdefault("CELERY_QUEUE", f"apbench-doors-{_RUN_TAG}")
# Redis keys of this benchmark's own (event streams, channel layer, throttles): session ids repeat
# across databases, and another benchmark on the same Redis would otherwise read this one's events.
os.environ.setdefault("REDIS_KEY_PREFIX", f"apbench-doors-{_RUN_TAG}")

from _harness import ROOT, BenchTenant, cpu_seconds, fake_model  # noqa: E402
from concurrent_runs import WebServer  # noqa: E402

from tenants.services import api_token_create, membership_create  # noqa: E402


class Worker:
    """A Celery worker process on this benchmark's queue (``--pool threads``: one process, the
    run host's loop in one of its threads, as ``make run`` starts it), logging to a file.

    ``concurrency``: pool threads, so runs it carries at once (None: ``WORKER_CONCURRENCY``, 200).
    """

    def __init__(self, concurrency: int | None = None) -> None:
        self.log = Path(tempfile.mkstemp(prefix="apbench-worker-", suffix=".log")[1])
        argv = [str(ROOT / ".venv/bin/celery"), "-A", "agent_platform", "worker", "--pool", "threads", "-l", "info",
                "-Q", os.environ["CELERY_QUEUE"], "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"{os.environ['CELERY_QUEUE']}@%h",
                "-I", "sessions.tests.tools_for_tests"]  # test_echo, which the benchmarks' agent is bound to
        if concurrency:
            argv += ["--concurrency", str(concurrency)]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if " ready." in self.log.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the Celery worker did not start: see {self.log}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        self.proc.terminate()  # warm shutdown: finishes what it runs
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)


class Platform:
    """The fake model (``responder``), a tenant with one agent on it (bound to ``test_echo``),
    an API token of the tenant's member, the web process and a worker; all stopped and deleted
    on exit.

    Attributes: ``base`` (the web process's ``http://127.0.0.1:<port>``), ``token`` (raw API
    token), ``agent`` (its ``slug`` names it in every protocol), ``bench`` (the
    :class:`_harness.BenchTenant`), ``web`` / ``worker`` (their ``pid``), ``model_pid``.
    """

    def __init__(self, responder: str, *, worker_concurrency: int | None = None, **agent_fields) -> None:
        self.responder, self.worker_concurrency, self.agent_fields = responder, worker_concurrency, agent_fields

    def __enter__(self) -> Platform:
        self._model = fake_model(self.responder)
        url = self._model.__enter__()
        self.model_pid = url.pid
        try:
            self.bench = BenchTenant(url, **self.agent_fields)
            self.agent = self.bench.agent
            membership = membership_create(tenant=self.bench.tenant, user=self.bench.user)
            self.token = api_token_create(membership=membership).raw
            self.web = WebServer()
            self.worker = Worker(self.worker_concurrency)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.base = f"http://127.0.0.1:{self.web.port}"
        return self

    def __exit__(self, *exc) -> None:
        for part in ("worker", "web"):
            if hasattr(self, part):
                getattr(self, part).close()
        if hasattr(self, "bench"):
            self.bench.__exit__(None, None, None)
        self._model.__exit__(None, None, None)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by (the web process, the worker)."""
        return cpu_seconds(self.web.proc.pid), cpu_seconds(self.worker.pid)
