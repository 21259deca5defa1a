"""Create the database named in DATABASE_URL (default: agent_platform on 127.0.0.1) if missing."""

from __future__ import annotations

import os
import sys

import dj_database_url
import psycopg
from psycopg import sql


def main() -> int:
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agent_platform")
    cfg = dj_database_url.parse(url)
    params = {
        "host": cfg.get("HOST") or "127.0.0.1",
        "port": cfg.get("PORT") or 5432,
        "user": cfg.get("USER") or "postgres",
        "password": cfg.get("PASSWORD") or None,
    }
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (cfg["NAME"],)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(cfg["NAME"])))
                print(f"created database {cfg['NAME']}", file=sys.stderr)
    except psycopg.OperationalError as exc:
        print(f"cannot reach PostgreSQL at {params['host']}:{params['port']}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
