"""docker-compose.yml and the Dockerfile (issue 23, "Keys and credentials"): no password or key
has a default published in the file; PostgreSQL and Redis require passwords; the serving
processes log in as the application role and never get the owner's password. (Docker cannot
run here: these read the files as compose would.)"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = re.compile(r"\$\{(?P<name>[A-Z_]+):\?[^}]+\}")


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    return {k: str(v) for k, v in env.items()}


def test_every_secret_is_required_from_the_environment_never_defaulted():
    services = _compose()["services"]
    postgres = _env(services["postgres"])
    assert REQUIRED.fullmatch(postgres["POSTGRES_PASSWORD"]).group("name") == "POSTGRES_PASSWORD"
    assert REQUIRED.fullmatch(_env(services["redis"])["REDIS_PASSWORD"])
    for name in ("web", "worker", "beat", "migrate"):
        env = _env(services[name])
        for key in ("SECRET_KEY", "ENCRYPTION_KEY"):
            assert REQUIRED.fullmatch(env[key]), (name, key)
        db = env["DATABASE_URL"]
        assert db.startswith("postgres://agent_platform_app:${DATABASE_APP_PASSWORD:?"), (name, db)
        assert env["REDIS_URL"].startswith("redis://:${REDIS_PASSWORD:?"), (name, env["REDIS_URL"])
    text = (ROOT / "docker-compose.yml").read_text()
    assert ":-postgres" not in text and "postgres:postgres@" not in text
    for match in re.finditer(r"\$\{(PASSWORD|[A-Z_]*(PASSWORD|SECRET|KEY))(:-|-)", text):
        raise AssertionError(f"a secret with a default: {match.group(0)}")


def test_redis_requires_its_password_and_the_healthcheck_uses_it():
    redis = _compose()["services"]["redis"]
    command = " ".join(redis["command"])
    assert "requirepass" in command and "$$REDIS_PASSWORD" in command
    assert "REDISCLI_AUTH" in " ".join(redis["healthcheck"]["test"])


def test_only_the_one_shot_migrate_service_holds_the_owners_password():
    services = _compose()["services"]
    assert "POSTGRES_PASSWORD" in _env(services["migrate"])["DATABASE_OWNER_URL"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker", "beat", "llm"):
        env = _env(services[name])
        assert "DATABASE_OWNER_URL" not in env and not any("POSTGRES_PASSWORD" in v for v in env.values()), name
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "migrate" not in " ".join(services["web"]["command"])


def test_the_image_holds_no_key():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "DEBUG=1" not in dockerfile
    assert not re.search(r"^\s*ENV\s+.*(SECRET_KEY|ENCRYPTION_KEY|PASSWORD)", dockerfile, re.M)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "var" in ignored and ".env" in ignored  # var/secrets.env and .env stay out of the build context


def test_the_layout_scales_workers_and_keeps_one_beat():
    """docs/operations-security.md, "More than one process": workers are replicas (WORKER_REPLICAS),
    beat is one, and web and workers share the same application settings (any web process serves
    any chat's events through Redis; any worker resumes any run)."""
    services = _compose()["services"]
    assert services["worker"]["deploy"]["replicas"] == "${WORKER_REPLICAS:-1}"
    assert services["beat"]["deploy"]["replicas"] == 1
    assert "--pool" in services["worker"]["command"] and "--concurrency" not in services["worker"]["command"]
    web, worker = _env(services["web"]), _env(services["worker"])
    for key in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ENCRYPTION_KEY"):
        assert web[key] == worker[key], key


def test_the_image_holds_the_projects_bytecode():
    """The image sets PYTHONDONTWRITEBYTECODE and its tree is read-only to the app user, so the
    project's modules are compiled when it is built, after they are copied in; else every
    process compiled them at every start (docs/operations-security.md, "Bytecode")."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ENV PYTHONDONTWRITEBYTECODE=1", dockerfile, re.M)
    copied, compiled, unprivileged = (re.search(rf"^{instruction}", dockerfile, re.M).start()
                                      for instruction in ("COPY \\. \\.", "RUN python -m compileall", "USER app"))
    assert copied < compiled < unprivileged


def test_make_lets_python_keep_its_bytecode():
    """An environment with PYTHONDONTWRITEBYTECODE=1 (this machine's) made every process that
    `make run` or `make test` started compile everything it imported, at every start: 6.9 s of
    CPU to import the web app, against 2.9 s with bytecode (bench/README.md)."""
    probe = subprocess.run(["make", "-s", "--eval", 'bytecode-probe: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"',
                            "bytecode-probe"], cwd=ROOT, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


def test_the_token_carrying_services_weigh_more_than_the_stores_when_cpu_is_short():
    """web and worker at twice Docker's default CPU weight (1024), the stores and the model at
    it: bench/README.md, "One parent over the platform", and docs/operations-security.md."""
    services = _compose()["services"]
    assert services["web"]["cpu_shares"] == services["worker"]["cpu_shares"] == 2048
    for name in ("postgres", "redis", "llm", "beat"):
        assert services[name].get("cpu_shares", 1024) == 1024, name
