"""What PostgreSQL spent on a benchmark: its processes' CPU and, when loaded, its statements.

- :func:`server_cpu_seconds`: user + system CPU of the whole cluster (the postmaster, its live
  processes, and the ones it has reaped: ``cutime``/``cstime``), from ``/proc``. Only when the
  server runs on this host; the figure is this benchmark's only if nothing else uses the
  cluster meanwhile (a throwaway cluster: bench/README.md, "What PostgreSQL spends per run").
- :class:`Statements`: ``pg_stat_statements`` (when the server preloads it and the extension
  exists in the database) read before and after a measured part, per normalised statement:
  calls, execution and planning time, rows, shared buffers hit and read. Read and reset as the
  owner's login (``DATABASE_OWNER_URL``), which may see every role's statements.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from django.conf import settings

_TICK = os.sysconf("SC_CLK_TCK")


def _owner_connect() -> psycopg.Connection:
    app = settings.DATABASES["default"]
    owner = app.get("OWNER") or {}
    return psycopg.connect(
        dbname=app["NAME"], user=owner.get("USER") or app["USER"], password=owner.get("PASSWORD") or None,
        host=owner.get("HOST") or app.get("HOST") or None, port=owner.get("PORT") or app.get("PORT") or None,
        autocommit=True,
    )


RUN_TABLES = ("agent_sessions_chatsession", "agent_sessions_run", "agent_sessions_message", "agent_sessions_toolcall",
              "agent_sessions_llmcall", "agent_sessions_usagemonth")
"""The tables every run reads and writes."""


def analyze(tables: tuple[str, ...] = RUN_TABLES) -> None:
    """``ANALYZE`` ``tables`` as the owner, so that the statements of the round are planned for
    the rows it works on. A benchmark deletes its rows when it ends, and autovacuum then
    records the tables as empty; planned from that, every statement by id on them is a
    sequential scan (its cost is 0 on an empty table), kept by the connections' prepared
    statements while the round fills the table: each one then reads the round's rows, O(N)
    per statement (bench/README.md, "What PostgreSQL spends per run"). A populated database's
    statistics never say that."""
    with _owner_connect() as conn:
        present = [t for t in tables if conn.execute("SELECT to_regclass(%s)", [t]).fetchone()[0] is not None]
        conn.execute(f"ANALYZE {', '.join(present)}")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from the 3rd (state) on


def postmaster_pid() -> int | None:
    """The server's postmaster, if it runs on this host (None otherwise)."""
    with _owner_connect() as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        fields = _stat(backend)  # while the backend lives: once the connection closes, it exits
    if fields is None:
        return None
    return int(fields[1])  # ppid


def server_cpu_seconds(postmaster: int) -> float:
    """CPU seconds (user + system) of the postmaster and every process it started, live or
    reaped, since the server started."""
    fields = _stat(postmaster)
    if fields is None:
        raise RuntimeError(f"postmaster {postmaster} is gone")
    total = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    for _, child in _children(postmaster):
        total += int(child[11]) + int(child[12])
    return total / _TICK


def server_pids(postmaster: int) -> list[int]:
    """The postmaster and the processes it started that still run (backends, its workers)."""
    return [postmaster, *(pid for pid, _ in _children(postmaster))]


def _children(parent: int) -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            child = _stat(int(entry.name))
            if child is not None and int(child[1]) == parent:
                found.append((int(entry.name), child))
    return found


@dataclass
class StatementStats:
    """One normalised statement's figures over a measured part (differences of two reads)."""

    query: str
    calls: int
    exec_ms: float
    plan_ms: float
    plans: int
    rows: int
    blks_hit: int
    blks_read: int


class Statements:
    """``pg_stat_statements`` for the benchmark's database, read as the owner."""

    COLUMNS = ("calls", "total_exec_time", "total_plan_time", "plans", "rows", "shared_blks_hit", "shared_blks_read")

    def __init__(self) -> None:
        with _owner_connect() as conn:
            self.available = bool(conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements') "
                "AND current_setting('shared_preload_libraries') LIKE '%pg_stat_statements%'"
            ).fetchone()[0])
        self._before: dict[tuple, tuple] = {}

    def _read(self) -> dict[tuple, tuple]:
        with _owner_connect() as conn:
            rows = conn.execute(
                f"SELECT userid, queryid, query, {', '.join(self.COLUMNS)} FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall()
        return {(r[0], r[1]): r[2:] for r in rows}

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> list[StatementStats]:
        """Each statement's figures since :meth:`start`, by execution time, largest first."""
        out = []
        for key, (query, *now) in self._read().items():
            then = self._before.get(key, (query, *[0] * len(now)))[1:]
            calls, exec_ms, plan_ms, plans, rows, hit, read = (a - b for a, b in zip(now, then, strict=True))
            if calls or plans:
                out.append(StatementStats(" ".join(query.split()), calls, exec_ms, plan_ms, plans, rows, hit, read))
        return sorted(out, key=lambda s: s.exec_ms + s.plan_ms, reverse=True)


def statements_table(stats: list[StatementStats], *, per: int, top: int = 25, width: int = 110) -> str:
    """``stats`` per run (divided by ``per``): the ``top`` statements and a total line."""
    lines = [f"{'calls':>7} {'exec ms':>8} {'plan ms':>8} {'plans':>6} {'rows':>7} {'blks hit':>9}  statement (per run)"]
    for s in stats[:top]:
        lines.append(f"{s.calls / per:7.2f} {s.exec_ms / per:8.3f} {s.plan_ms / per:8.3f} {s.plans / per:6.2f} "
                     f"{s.rows / per:7.2f} {s.blks_hit / per:9.1f}  {s.query[:width]}")
    lines.append(f"{sum(s.calls for s in stats) / per:7.2f} {sum(s.exec_ms for s in stats) / per:8.3f} "
                 f"{sum(s.plan_ms for s in stats) / per:8.3f} {sum(s.plans for s in stats) / per:6.2f} "
                 f"{sum(s.rows for s in stats) / per:7.2f} {sum(s.blks_hit for s in stats) / per:9.1f}  "
                 f"all {len(stats)} statements")
    return "\n".join(lines)


TABLE_COLUMNS = ("seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch", "n_tup_ins", "n_tup_upd", "n_tup_hot_upd")


def table_counters() -> dict[str, tuple[int, ...]]:
    """``pg_stat_user_tables``' scan and write counters by table (the server updates them when
    a backend reports, at the latest when it ends or goes idle)."""
    with _owner_connect() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(f"SELECT relname, {', '.join(TABLE_COLUMNS)} FROM pg_stat_user_tables").fetchall()
    return {r[0]: tuple(x or 0 for x in r[1:]) for r in rows}


def tables_table(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]], *, per: int) -> str:
    """The tables whose counters moved between two :func:`table_counters`, per run."""
    lines = [f"{'seq scans':>9} {'seq rows':>9} {'idx scans':>9} {'idx rows':>9} {'inserts':>8} {'updates':>8} "
             f"{'HOT':>6}  table (per run)"]
    moved = []
    for table, now in after.items():
        delta = [a - b for a, b in zip(now, before.get(table, (0,) * len(now)), strict=True)]
        if any(delta):
            moved.append((table, delta))
    for table, d in sorted(moved, key=lambda x: -(x[1][1] + x[1][3])):
        lines.append(f"{d[0] / per:9.2f} {d[1] / per:9.1f} {d[2] / per:9.2f} {d[3] / per:9.1f} {d[4] / per:8.2f} "
                     f"{d[5] / per:8.2f} {d[6] / per:6.2f}  {table}")
    return "\n".join(lines)


class DatabaseWatch:
    """PostgreSQL's CPU (:func:`server_cpu_seconds`, when the server is on this host) and
    statements (:class:`Statements`, when loaded) over a measured part, reported per run and
    per model turn. ``top``: how many statements :meth:`report` lists (0: only the totals)."""

    def __init__(self, *, turns_per_run: int, top: int = 25) -> None:
        self.turns_per_run = turns_per_run
        self.top = top
        self.postmaster = postmaster_pid()
        self.statements = Statements()
        self._cpu = 0.0
        self.cpu_seconds: float | None = None
        self.stats: list[StatementStats] = []
        self._tables: dict[str, tuple[int, ...]] = {}
        self.tables = ""

    def start(self) -> None:
        self._tables = table_counters()
        if self.statements.available:
            self.statements.start()
        if self.postmaster is not None:
            self._cpu = server_cpu_seconds(self.postmaster)

    def stop(self) -> None:
        if self.postmaster is not None:
            self.cpu_seconds = server_cpu_seconds(self.postmaster) - self._cpu
        if self.statements.available:
            self.stats = self.statements.stop()
        time.sleep(1.5)  # backends report their table counters at most once a second
        self._tables_after = table_counters()

    def report(self, runs: int) -> str:
        """Lines to print after a round of ``runs`` runs."""
        turns = runs * self.turns_per_run
        parts = []
        if self.cpu_seconds is not None:
            parts.append(f"PostgreSQL CPU per run {self.cpu_seconds / runs * 1000:.2f} ms, per turn "
                         f"{self.cpu_seconds / turns * 1000:.2f} ms (the whole cluster, from /proc)")
        if self.stats:
            execs = sum(s.exec_ms for s in self.stats)
            plans = sum(s.plan_ms for s in self.stats)
            calls = sum(s.calls for s in self.stats)
            parts.append(f"statements per run {calls / runs:.2f} (per turn {calls / turns:.2f}), execution "
                         f"{execs / runs:.2f} ms, planning {plans / runs:.2f} ms per run (pg_stat_statements)")
            if self.top:
                parts.append(statements_table(self.stats, per=runs, top=self.top))
        elif not self.statements.available:
            parts.append("pg_stat_statements not loaded: no statement figures")
        if self.top:
            parts.append(tables_table(self._tables, self._tables_after, per=runs))
        return "\n".join("        " + line for part in parts for line in part.splitlines())
