"""bench/_pg_stats.py finds the PostgreSQL server it measures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _pg_stats import postmaster_pid, server_cpu_seconds, server_pids  # noqa: E402


def test_the_postmaster_is_found_every_time() -> None:
    """Read while the asking backend lives: read after its connection closed, the backend had
    often exited already, and ``scale_out.py`` printed PostgreSQL's CPU as ``nan``."""
    found = {postmaster_pid() for _ in range(20)}
    assert len(found) == 1 and None not in found
    (postmaster,) = found
    assert Path(f"/proc/{postmaster}/cmdline").read_bytes().split(b"\0")[0].endswith(b"postgres")
    assert server_cpu_seconds(postmaster) > 0
    pids = server_pids(postmaster)
    assert pids[0] == postmaster and len(pids) > 1 and os.getpid() not in pids  # its backends and workers
