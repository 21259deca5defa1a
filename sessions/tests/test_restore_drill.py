"""The backup and restore drill of docs/operations-security.md ("Backup and restore"), run for
real: a run waiting for an approval is backed up with ``pg_dump`` (custom format, as the
database's owner), restored with ``pg_restore`` into a fresh database, ``manage.py migrate``
re-applies the role's grants and row-level security, and a process of the platform on the
restored database approves the call and finishes the run: the conversation, the paused run
and its pending tool call all came back, and the original database was left as it was."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connection

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

ROOT = Path(__file__).resolve().parents[2]

# Run in a process of the platform on the restored database: the run's user approves the call
# through the service the API uses, then the run is executed in this process (its queue is one
# no worker consumes). Prints the run as JSON.
_FINISH_ON_RESTORED = """
import asyncio, json, django
django.setup()
import sessions.tests.tools_for_tests  # test_echo, as in the test process
from sessions.models import Approval, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.services import approval_decide
from tenants.scoping import tenant_scope
run_id = {run_id}
with tenant_scope({tenant_id}):
    approval = Approval.objects.get(run_id=run_id)
    approval_decide(approval=approval, user=approval.run.user, decision="approve", reason="restore drill")
asyncio.run(execute_run(run_id))
with tenant_scope({tenant_id}):
    run = Run.objects.get(pk=run_id)
    calls = [(c.name, c.status, c.result) for c in ToolCall.objects.filter(run_id=run_id)]
print(json.dumps({{"status": run.status, "reason": run.error, "reply": run.reply, "attempt": run.attempt, "calls": calls}}))
"""


def _program(name: str) -> str:
    """``name`` of the PostgreSQL the tests run on (scripts/ensure_postgres.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import ensure_postgres

    return ensure_postgres.client_program(name)


def _owner_env() -> tuple[dict[str, str], list[str]]:
    """The environment and connection arguments of PostgreSQL's programs, as the owner."""
    owner = connection.settings_dict.get("OWNER") or {}
    db = connection.settings_dict
    args = ["-h", str(owner.get("HOST") or db["HOST"]), "-p", str(owner.get("PORT") or db["PORT"]),
            "-U", str(owner.get("USER") or "postgres")]
    env = {**os.environ}
    if owner.get("PASSWORD"):
        env["PGPASSWORD"] = owner["PASSWORD"]
    return env, args


def _check(command: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, **kwargs)
    assert done.returncode == 0, (command[0], done.stdout[-2000:], done.stderr[-3000:])
    return done


def test_a_paused_run_backed_up_and_restored_into_a_fresh_database_finishes_there(world, fake_llm, no_enqueue,
                                                                                   tmp_path):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], read_timeout_seconds=30)
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "*", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "restored"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Echo restored")
    asyncio.run(execute_run(run.pk))
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"

    env, login = _owner_env()
    source = connection.settings_dict["NAME"]
    restored = f"restore_drill_{uuid.uuid4().hex[:10]}"
    dump = tmp_path / "backup.dump"
    _check([_program("pg_dump"), *login, "--format=custom", f"--file={dump}", source], env)
    _check([_program("createdb"), *login, restored], env)
    try:
        _check([_program("pg_restore"), *login, "--exit-on-error", f"--dbname={restored}", str(dump)], env)
        db = connection.settings_dict
        owner = db.get("OWNER") or {}
        platform_env = {
            **os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings_test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{restored}",
            "DATABASE_OWNER_URL": f"postgres://{owner.get('USER') or 'postgres'}@{owner.get('HOST') or db['HOST']}:"
                                  f"{owner.get('PORT') or db['PORT']}/{restored}",
            "RUNS_QUEUE": f"restore-drill-{uuid.uuid4().hex[:8]}",  # consumed by no worker
        }
        _check([sys.executable, "manage.py", "migrate", "--noinput"], platform_env, cwd=ROOT)
        fake_llm.script(Reply("The echo said restored."))
        script = _FINISH_ON_RESTORED.format(run_id=run.pk, tenant_id=world.tenant.pk)
        done = _check([sys.executable, "-c", script], platform_env, cwd=ROOT)
        finished = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([_program("dropdb"), *login, "--force", "--if-exists", restored], env=env, capture_output=True,
                       timeout=60)
    assert finished == {"status": "completed", "reason": "", "reply": "The echo said restored.", "attempt": 2,
                        "calls": [["test_echo", "succeeded", "echo: restored"]]}
    # The original database was not touched by the restored one's process.
    assert Run.all_tenants.get(pk=run.pk).status == "awaiting_approval"
    assert Approval.all_tenants.get(run_id=run.pk).status == "pending"
    assert ToolCall.all_tenants.get(run_id=run.pk).status != "succeeded"
