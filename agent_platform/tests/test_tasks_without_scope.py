"""Every Celery task and management command of the project, run as a worker or an operator runs
it (issue 34): in a thread of its own that starts in no tenant scope (a worker's pool thread, a
``manage.py`` process), with its own database connection, on rows of two tenants; each test
asserts the work was done in both.

Outside any scope the database shows no tenant-owned row (row-level security, tenants/rls.py).
A task or command that does not enter the scope it needs itself (``system_scope`` for work
across tenants, ``tenant_scope`` for one tenant's) finds nothing here and silently does
nothing, so its test fails. The test bodies run outside any scope too (``no_scope``): rows are
made and inspected in explicit scopes.

``TESTS`` maps each task's and command's name to its test; :func:`test_every_task_and_command_has_a_test`
fails for a task or command of the project that has none (add its test and its entry).
"""

from __future__ import annotations

import contextvars
import io
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from agents.tests.factories import AgentFactory, agent_with_route
from llm.testing import Reply
from sessions.models import Approval, ChatSession, Message, Run, RunStatus, ToolCall
from tenants.scoping import current_scope, system_scope, tenant_scope

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_scope"),
              pytest.mark.timeout(180)]

TESTS: dict[str, str] = {
    # Celery tasks (agent_platform.celery.app.tasks, Celery's own left out)
    "sessions.run_execute": "test_run_execute",
    "sessions.runs_sweep": "test_runs_sweep",
    "sessions.chat_session_title_generate": "test_chat_session_title_generate",
    "sessions.chat_sessions_purge": "test_chat_sessions_purge",
    "sessions.llm_bodies_purge": "test_llm_bodies_purge",
    "memory.extract_session": "test_memory_extract_session",
    "memory.extract_due": "test_memory_extract_due",
    "memory.expire": "test_memory_expire",
    "knowledge.document_ingest": "test_document_ingest",
    "knowledge.knowledge_base_reembed": "test_knowledge_base_reembed",
    "capabilities.mcp_server_test_connection": "test_mcp_server_test_connection",
    "capabilities.mcp_prompts_request": "test_mcp_prompts_request",
    "capabilities.mcp_resources_request": "test_mcp_resources_request",
    "evaluation.experiment_advance": "test_experiment_advance",
    "automations.schedules_tick": "test_schedules_tick",
    "automations.delivery_attempt": "test_webhook_delivery_attempt",
    "automations.deliveries_due": "test_webhook_deliveries_due",
    "automations.webhook_rows_purge": "test_webhook_rows_purge",
    "oauth_server.cleanup": "test_oauth_cleanup",
    # management commands of the project's apps
    "skills_import": "test_skills_import_command",
    "catalogue_import": "test_catalogue_import_command",
    "catalogue_check": "test_catalogue_check_command",
    "rotate_encryption_key": "test_rotate_encryption_key_command",
    "seed_demo": "test_seed_demo_command",
    "migrate": "test_migrate_command",
    "flush": "test_flush_command",
    "evaluate": "test_evaluate_command",
    "agents_export": "test_agents_export_and_import_commands",
    "agents_import": "test_agents_export_and_import_commands",
}


# --- running as a worker does ------------------------------------------------------------------


def as_worker(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` in a new thread that starts as a Celery worker's pool thread
    (or a ``manage.py`` process) does: an empty context (no tenant scope) and a database
    connection of its own, closed at the end. Returns its result; re-raises its exception."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["scope"] = current_scope()
            outcome["value"] = func(*args, **kwargs)
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=contextvars.Context().run, args=(body,), name="test-worker-pool-thread")
    thread.start()
    thread.join(timeout=150)
    assert not thread.is_alive(), f"{func} did not finish in 150 s"
    assert outcome.get("scope", "unset") is None, "the worker thread started in a tenant scope"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def run_task(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run Celery ``task`` as a worker does (Celery's tracer, ``task.apply``) in a worker-like
    thread (:func:`as_worker`); its return value."""
    return as_worker(lambda: task.apply(args=args, kwargs=kwargs, throw=True).get())


def in_system_scope(func: Callable[[], Any]) -> Any:
    with system_scope():
        return func()


# --- the guard ---------------------------------------------------------------------------------


def _project_tasks() -> set[str]:
    from agent_platform.celery import app

    app.loader.import_default_modules()  # what a worker does at start: autodiscovery of tasks.py
    return {name for name in app.tasks if not name.startswith("celery.")}


def _project_commands() -> set[str]:
    from django.apps import apps
    from django.core.management import get_commands

    base = Path(settings.BASE_DIR).resolve()
    ours = {config.name for config in apps.get_app_configs()
            if Path(config.path).resolve().is_relative_to(base) and ".venv" not in Path(config.path).parts}
    return {name for name, app_name in get_commands().items() if app_name in ours}


def test_every_task_and_command_has_a_test():
    tasks, commands = _project_tasks(), _project_commands()
    assert {"memory.expire", "sessions.chat_sessions_purge"} <= tasks and {"seed_demo", "migrate"} <= commands
    found = tasks | commands
    assert not found - set(TESTS), f"tasks or commands without a test run outside any scope: {sorted(found - set(TESTS))}"
    assert not set(TESTS) - found, f"TESTS names what is no task or command: {sorted(set(TESTS) - found)}"
    missing = [test for test in TESTS.values() if not callable(globals().get(test))]
    assert not missing, f"tests named in TESTS that do not exist: {missing}"


def test_the_worker_thread_starts_outside_any_scope_even_from_a_scoped_test(world, other_world):
    from tenants.models import Tenant

    with system_scope():
        assert Tenant.objects.count() == 2
        assert as_worker(current_scope) is None
        assert as_worker(Tenant.objects.count) == 0  # the database shows it no tenant
        assert as_worker(in_system_scope, Tenant.objects.count) == 2


# --- sessions ----------------------------------------------------------------------------------


def _chat_with_run(world, agent, content: str = "hello") -> tuple[ChatSession, Run]:
    from sessions.services import chat_session_create, message_post

    with tenant_scope(world.tenant.pk):
        session = chat_session_create(user=world.member, agent=agent)
        return session, message_post(session=session, user=world.member, content=content)


def test_run_execute(world, other_world, fake_llm, no_enqueue):
    from sessions import tasks
    from sessions.runner.host import run_host_shutdown

    fake_llm.script(Reply("Answer for acme."), Reply("Answer for globex."))
    with system_scope():
        ours = _chat_with_run(world, agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url]))[1]
        theirs = _chat_with_run(other_world, agent_with_route(tenant=other_world.tenant,
                                                              base_urls=[fake_llm.base_url]))[1]
    try:
        run_task(tasks.run_execute, ours.pk, world.tenant.pk)  # as run_enqueue sends it
        run_task(tasks.run_execute, theirs.pk)  # as the sweeper re-sends it: no tenant id
    finally:
        run_host_shutdown(timeout_seconds=15)
    with system_scope():
        done = {r.pk: (r.status, r.reply) for r in Run.all_tenants.filter(pk__in=[ours.pk, theirs.pk])}
    assert done == {ours.pk: ("completed", "Answer for acme."), theirs.pk: ("completed", "Answer for globex.")}


def test_runs_sweep(world, other_world, no_enqueue):
    from sessions import tasks

    long_ago = timezone.now() - timedelta(hours=1)
    orphans, waiting, stuck = [], [], []
    with system_scope():
        for w in (world, other_world):
            agent = AgentFactory(tenant=w.tenant)
            session = ChatSession.all_tenants.create(tenant=w.tenant, agent=agent, user=w.member)
            orphans.append(Run.all_tenants.create(tenant=w.tenant, session=session, user=w.member, input="x",
                                                  status=RunStatus.RUNNING, started_at=long_ago,
                                                  heartbeat_at=long_ago).pk)
            paused_session = ChatSession.all_tenants.create(tenant=w.tenant, agent=agent, user=w.member)
            paused = Run.all_tenants.create(tenant=w.tenant, session=paused_session, user=w.member, input="y",
                                            status=RunStatus.AWAITING_APPROVAL)
            call = ToolCall.all_tenants.create(tenant=w.tenant, run=paused, turn=0, call_id="c1", name="t")
            Approval.all_tenants.create(tenant=w.tenant, run=paused, tool_call=call, tool_name="t",
                                        expires_at=long_ago)
            waiting.append(paused.pk)
            queued_session = ChatSession.all_tenants.create(tenant=w.tenant, agent=agent, user=w.member)
            queued = Run.all_tenants.create(tenant=w.tenant, session=queued_session, user=w.member, input="z",
                                            status=RunStatus.QUEUED)
            Run.all_tenants.filter(pk=queued.pk).update(created_at=long_ago)
            stuck.append(queued.pk)
    counts = run_task(tasks.runs_sweep)
    assert (counts["resumed"], counts["approvals_expired"], counts["resent"]) == (2, 2, 2)
    assert set(no_enqueue) == set(orphans + stuck)  # handed to a worker again, both tenants' (some twice: harmless)
    with system_scope():
        assert list(Approval.all_tenants.values_list("status", flat=True)) == ["expired", "expired"]
        assert set(Run.all_tenants.filter(pk__in=waiting).values_list("status", flat=True)) == {"failed"}


def test_chat_session_title_generate(world, other_world, fake_llm, settings, no_enqueue):
    from sessions import tasks

    settings.CHAT_TITLES_FROM_MODEL = True
    fake_llm.script(Reply("Kyoto Trip Plan"), Reply("Lisbon Weekend Plan"))
    chats = []
    with system_scope():
        for w, question in ((world, "Plan a trip to Kyoto"), (other_world, "Plan a weekend in Lisbon")):
            session, run = _chat_with_run(w, agent_with_route(tenant=w.tenant, base_urls=[fake_llm.base_url]),
                                          question)
            Run.all_tenants.filter(pk=run.pk).update(status=RunStatus.COMPLETED, reply="Here is a plan.")
            chats.append((session, run))
    titles = [run_task(tasks.chat_session_title_generate, session_id=s.pk, run_id=r.pk, tenant_id=s.tenant_id)
              for s, r in chats]
    assert titles == ["Kyoto Trip Plan", "Lisbon Weekend Plan"]
    with system_scope():
        stored = [ChatSession.all_tenants.get(pk=s.pk).title for s, _ in chats]
    assert stored == titles


def test_chat_sessions_purge(world, other_world):
    from sessions import tasks

    with system_scope():
        old, kept = [], []
        for w in (world, other_world):
            agent = AgentFactory(tenant=w.tenant)
            for days, bucket in ((31, old), (1, kept)):
                session = ChatSession.all_tenants.create(tenant=w.tenant, agent=agent, user=w.member)
                ChatSession.all_tenants.filter(pk=session.pk).update(deleted_at=timezone.now() - timedelta(days=days))
                bucket.append(session.pk)
    with override_settings(CHAT_PURGE_AFTER_DAYS=30):
        assert run_task(tasks.chat_sessions_purge) == 2
    with system_scope():
        assert sorted(ChatSession.all_tenants.values_list("pk", flat=True)) == sorted(kept)


def test_llm_bodies_purge(world, other_world):
    from sessions import tasks
    from sessions.models import LLMCall, LLMCallBody
    from tenants.models import Tenant

    with system_scope():
        old, kept = [], []
        for w in (world, other_world):
            Tenant.objects.filter(pk=w.tenant.pk).update(record_llm_bodies=True, llm_body_retention_days=7)
            for days, bucket in ((8, old), (1, kept)):
                call = LLMCall.all_tenants.create(tenant=w.tenant, attempt=1, entry_index=0, provider_name="p",
                                                  model="m", status="succeeded", purpose="title")
                body = LLMCallBody.all_tenants.create(tenant=w.tenant, llm_call=call, request="{}",
                                                      created_at=timezone.now() - timedelta(days=days))
                bucket.append(body.pk)
    assert run_task(tasks.llm_bodies_purge) == 2
    with system_scope():
        assert sorted(LLMCallBody.all_tenants.values_list("pk", flat=True)) == sorted(kept)


# --- memory ------------------------------------------------------------------------------------


def _memory_chat(world, agent, *, minutes_ago: float) -> ChatSession:
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, status="completed",
                                 input="I live in Lyon and work as a nurse.", reply="Noted.")
    for position, (role, text) in enumerate((("user", run.input), ("assistant", run.reply))):
        Message.all_tenants.create(tenant=world.tenant, session=session, run=run, position=position, role=role,
                                   content=text)
    Message.all_tenants.filter(session=session).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    return session


@pytest.fixture
def fake_embedder(settings):
    from knowledge.tests.fake_embedder import running

    with running() as embedder:
        settings.EMBEDDINGS_BASE_URL = embedder.base_url
        yield embedder


def test_memory_extract_session(world, other_world, fake_llm, fake_embedder):
    from memory import tasks
    from memory.models import Memory
    from memory.tests.factories import memory_binding

    fake_llm.script(*(Reply(json.dumps({"memories": [{"text": text, "category": "fact"}]}))
                      for text in ("Lives in Lyon.", "Works as a nurse.")))
    sessions = []
    with system_scope():
        for w in (world, other_world):
            agent = agent_with_route(tenant=w.tenant, base_urls=[fake_llm.base_url])
            memory_binding(agent)
            sessions.append(_memory_chat(w, agent, minutes_ago=5))
    outcomes = [run_task(tasks.memory_extract_session, s.pk, s.tenant_id, True) for s in sessions]
    assert [(o["status"], o["added"], o["error"]) for o in outcomes] == [("done", 1, ""), ("done", 1, "")]
    with system_scope():
        stored = set(Memory.all_tenants.values_list("tenant_id", "text"))
    assert stored == {(world.tenant.pk, "Lives in Lyon."), (other_world.tenant.pk, "Works as a nurse.")}


def test_memory_extract_due(world, other_world, monkeypatch):
    from memory import tasks
    from memory.tests.factories import memory_binding

    with system_scope():
        due = []
        for w in (world, other_world):
            agent = AgentFactory(tenant=w.tenant)
            memory_binding(agent, extract_after_idle_minutes=1)
            due.append((_memory_chat(w, agent, minutes_ago=5).pk, w.tenant.pk))
    sent = []
    monkeypatch.setattr(tasks.memory_extract_session, "delay", lambda *args: sent.append(args))
    assert run_task(tasks.memory_extract_due) == 2
    assert sorted(sent) == sorted(due)


def test_memory_expire(world, other_world):
    from memory import tasks
    from memory.models import Memory
    from memory.tests.factories import memory_binding, memory_make

    with system_scope():
        for w in (world, other_world):
            agent = AgentFactory(tenant=w.tenant)
            memory_binding(agent, retention_days=30)
            for text, days in (("stale", 31), ("fresh", 29)):
                m = memory_make(tenant=w.tenant, user=w.member, agent=agent, text=f"{text} of {w.tenant.slug}")
                Memory.all_tenants.filter(pk=m.pk).update(updated_at=timezone.now() - timedelta(days=days))
    assert run_task(tasks.memories_expire) == 2
    with system_scope():
        assert set(Memory.all_tenants.values_list("text", flat=True)) == {"fresh of acme", "fresh of globex"}


# --- knowledge ---------------------------------------------------------------------------------


@pytest.fixture
def knowledge_queued(monkeypatch):
    """The knowledge tasks the services send on commit, recorded (the tests run them)."""
    calls: dict[str, list[dict]] = {"ingest": [], "reembed": []}
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kw: calls["ingest"].append(kw))
    monkeypatch.setattr("knowledge.tasks.knowledge_base_reembed_enqueue", lambda **kw: calls["reembed"].append(kw))
    return calls


def _knowledge_bases(worlds, embedder, model: str = "all-minilm-l6-v2") -> list:
    from knowledge.models import KnowledgeBase
    from knowledge.tests import builders

    kbs = []
    for w in worlds:
        kb = builders.knowledge_base(w.tenant, f"Handbook of {w.tenant.slug}", base_url=embedder.base_url)
        KnowledgeBase.all_tenants.filter(pk=kb.pk).update(embedding_model=model)
        kbs.append(KnowledgeBase.all_tenants.get(pk=kb.pk))
    return kbs


def test_document_ingest(world, other_world, fake_embedder, knowledge_queued):
    from knowledge import tasks
    from knowledge.models import Chunk, Document
    from knowledge.services import document_add_text

    with system_scope():
        for kb in _knowledge_bases((world, other_world), fake_embedder):
            with tenant_scope(kb.tenant_id):
                document_add_text(knowledge_base=kb, title="Boats", text="The harbour keeps twelve sailing boats.")
    assert len(knowledge_queued["ingest"]) == 2
    assert [run_task(tasks.document_ingest, **kw) for kw in knowledge_queued["ingest"]] == ["ready", "ready"]
    with system_scope():
        assert set(Document.all_tenants.values_list("tenant_id", "status")) == {
            (world.tenant.pk, "ready"), (other_world.tenant.pk, "ready")}
        assert set(Chunk.all_tenants.values_list("tenant_id", flat=True)) == {world.tenant.pk, other_world.tenant.pk}


def test_knowledge_base_reembed(world, other_world, fake_embedder, knowledge_queued):
    from knowledge import tasks
    from knowledge.ingestion import document_ingest
    from knowledge.models import Chunk, KnowledgeBase
    from knowledge.services import document_add_text, knowledge_base_update

    with system_scope():
        for kb in _knowledge_bases((world, other_world), fake_embedder, model="hash-a-384"):
            with tenant_scope(kb.tenant_id):
                doc = document_add_text(knowledge_base=kb, title="Boats", text="Twelve sailing boats.").document
                doc.refresh_from_db()
                assert document_ingest(document_id=doc.pk, generation=doc.generation) == "ready"
                knowledge_base_update(knowledge_base=kb, embedding_model="hash-b-64", dimensions=64)
    assert len(knowledge_queued["reembed"]) == 2
    assert [run_task(tasks.knowledge_base_reembed, **kw) for kw in knowledge_queued["reembed"]] == ["done", "done"]
    with system_scope():
        for kb in KnowledgeBase.all_tenants.all():
            assert set(Chunk.all_tenants.filter(knowledge_base=kb).values_list("embedding_fingerprint", "dimensions")
                       ) == {(kb.embedding_fingerprint, 64)}
            assert not kb.reembedding


# --- capabilities ------------------------------------------------------------------------------


def test_mcp_prompts_request(world, other_world):
    import redis

    from capabilities import tasks
    from capabilities.models import McpServer
    from capabilities.tests.prompts_test_server import serve_prompts

    with serve_prompts() as running:
        with system_scope():
            servers = [McpServer.all_tenants.create(tenant=w.tenant, name="Docs", alias="docs",
                                                    transport="streamable_http", url=running.url,
                                                    connect_timeout_seconds=10) for w in (world, other_world)]
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            for server, w in zip(servers, (world, other_world), strict=True):
                reply_key = f"{settings.REDIS_KEY_PREFIX}:mcp-prompts:scope-{server.pk}"
                run_task(tasks.mcp_prompts_request, tenant_id=server.tenant_id, user_id=w.member.pk,
                         request={"op": "list", "servers": [server.pk]}, reply_key=reply_key)
                [row] = json.loads(client.lpop(reply_key))["servers"]
                assert row["error"] == "" and row["prompts"][0]["name"] == "review"
        finally:
            client.close()


def test_mcp_resources_request(world, other_world):
    import redis

    from capabilities import tasks
    from capabilities.models import McpServer
    from capabilities.tests.mcp_test_server import serve_mcp_http

    with serve_mcp_http() as running:
        with system_scope():
            servers = [McpServer.all_tenants.create(tenant=w.tenant, name="Docs", alias="docs",
                                                    transport="streamable_http", url=running.url,
                                                    connect_timeout_seconds=10) for w in (world, other_world)]
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            for server, w in zip(servers, (world, other_world), strict=True):
                reply_key = f"{settings.REDIS_KEY_PREFIX}:mcp-resources:scope-{server.pk}"
                run_task(tasks.mcp_resources_request, tenant_id=server.tenant_id, user_id=w.member.pk,
                         server_ids=[server.pk], query="readme", reply_key=reply_key)
                answer = json.loads(client.lpop(reply_key))
                assert answer["errors"] == [] and [r["uri"] for r in answer["results"]] == ["doc://notes/readme"]
        finally:
            client.close()


def test_mcp_server_test_connection(world, other_world):
    import redis

    from capabilities import tasks
    from capabilities.models import McpServer
    from capabilities.tests.mcp_test_server import serve_mcp_http

    with serve_mcp_http() as running:
        with system_scope():
            servers = [McpServer.all_tenants.create(tenant=w.tenant, name="Web", alias="web",
                                                    transport="streamable_http", url=running.url,
                                                    connect_timeout_seconds=10) for w in (world, other_world)]
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            for server in servers:
                reply_key = f"{settings.REDIS_KEY_PREFIX}:mcp-test:scope-{server.pk}"
                run_task(tasks.mcp_server_test_connection, tenant_id=server.tenant_id, server_id=server.pk,
                         reply_key=reply_key)
                reply = json.loads(client.lpop(reply_key))
                assert reply["ok"], reply["error"]
                assert "echo" in [t["name"] for t in reply["tools"]]
        finally:
            client.close()
    with system_scope():
        stored = {s.tenant_id: s for s in McpServer.all_tenants.all()}
    assert set(stored) == {world.tenant.pk, other_world.tenant.pk}
    for server in stored.values():
        assert server.tools_snapshot_at is not None and server.last_error == ""
        assert "echo" in [t["name"] for t in server.tools_snapshot]


# --- management commands -----------------------------------------------------------------------


def test_skills_import_command(world, other_world, tmp_path):
    from capabilities.models import Skill

    for w in (world, other_world):
        folder = tmp_path / w.tenant.slug / "notes"
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(f"---\nname: notes-{w.tenant.slug}\ndescription: Take notes.\n---\nWrite.\n")
        as_worker(call_command, "skills_import", w.tenant.slug, str(tmp_path / w.tenant.slug), verbosity=0)
    with system_scope():
        assert set(Skill.all_tenants.values_list("tenant_id", "name")) == {
            (world.tenant.pk, "notes-acme"), (other_world.tenant.pk, "notes-globex")}


def test_catalogue_import_command(world, other_world, tmp_path):
    from capabilities.catalogue import ProgramTemplate

    def catalogue(*tenants: str) -> str:
        path = tmp_path / f"catalogue-{len(tenants)}.yaml"
        path.write_text("templates:\n  - slug: scope-probe\n    name: Probe\n    kind: cli\n"
                        '    argv: ["factor", "--", "{n}"]\n'
                        "    parameters_schema: {type: object, properties: {n: {type: integer}}, required: [n]}\n"
                        f"    tenants: [{', '.join(tenants)}]\n")
        return str(path)

    def offered_to() -> set[str]:
        with system_scope():
            return set(ProgramTemplate.objects.get(slug="scope-probe").tenants.values_list("slug", flat=True))

    as_worker(call_command, "catalogue_import", catalogue("acme", "globex"), verbosity=0)
    assert offered_to() == {"acme", "globex"}
    as_worker(call_command, "catalogue_import", catalogue("acme"), verbosity=0)  # globex no longer listed
    assert offered_to() == {"acme"}


def test_catalogue_check_command(world, other_world):
    """The catalogue is the platform's (no tenant scope needed): the check reads every template."""
    import io

    from django.core.management.base import CommandError

    from capabilities.catalogue import ProgramTemplate

    with system_scope():
        ProgramTemplate.objects.create(slug="check-probe", name="Probe", kind="cli", argv=["factor", "--", "{n}"])
        ProgramTemplate.objects.create(slug="check-hidden", name="Hidden", kind="cli", argv=["/root/bin/x"])
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 of 2 template"):
        as_worker(call_command, "catalogue_check", "--no-start", stdout=out)
    assert "ok    check-probe (cli)" in out.getvalue() and "FAIL  check-hidden (cli)" in out.getvalue()


def test_rotate_encryption_key_command(world, other_world):
    from tenants.crypto import SecretDecryptError, secret_decrypt, secret_encrypt
    from tenants.models import Tenant

    old, new = settings.ENCRYPTION_KEY, Fernet.generate_key().decode()
    with system_scope():
        secrets = {w.tenant.pk: secret_encrypt(tenant=w.tenant, plaintext=f"sk-{w.tenant.slug}")
                   for w in (world, other_world)}
    with override_settings(ENCRYPTION_KEY=f"{new},{old}"):
        as_worker(call_command, "rotate_encryption_key", verbosity=0)
    with system_scope(), override_settings(ENCRYPTION_KEY=new):  # the old key is gone
        for tenant_id, ciphertext in secrets.items():
            tenant = Tenant.objects.get(pk=tenant_id)
            assert secret_decrypt(tenant=tenant, ciphertext=ciphertext) == f"sk-{tenant.slug}"
    with system_scope(), pytest.raises(SecretDecryptError):
        secret_decrypt(tenant=Tenant.objects.get(pk=world.tenant.pk), ciphertext=secrets[world.tenant.pk])


def test_seed_demo_command(world, other_world, fake_embedder, knowledge_queued):
    from agents.models import AgentInstance
    from knowledge.models import Document
    from tenants.models import Membership, Tenant

    as_worker(call_command, "seed_demo", verbosity=0)
    with system_scope():
        demo = Tenant.objects.get(slug="demo")
        agents = set(AgentInstance.all_tenants.filter(tenant=demo).values_list("name", flat=True))
        members = set(Membership.all_tenants.filter(tenant=demo).values_list("user__username", "role"))
        documents = set(Document.all_tenants.filter(tenant=demo).values_list("title", flat=True))
        others = AgentInstance.all_tenants.filter(tenant__in=[world.tenant, other_world.tenant]).count()
    assert agents == {"Assistant", "Researcher", "Docs assistant"}
    assert members == {("demo-admin", "admin"), ("demo-user", "member")}
    guides = {f"docs/{p.name}" for p in (settings.BASE_DIR / "docs").glob("*.md")}
    assert {"docs/user-guide.md", "docs/admin-guide.md", "docs/api.md", "docs/operations-security.md",
            "docs/settings.md"} <= guides
    assert "docs/model-accuracy.md" in guides  # quotes the evaluation's questions: left out
    assert documents == {"README.md", "ARCHITECTURE.md", *guides} - {"docs/model-accuracy.md"}
    assert len(knowledge_queued["ingest"]) == len(documents)  # one ingestion per document
    assert others == 0  # the other tenants are left as they were


def test_migrate_command(world, other_world):
    from agents.models import AgentInstance
    from tenants import rls

    with system_scope():
        agents = {w.tenant.pk: AgentFactory(tenant=w.tenant).pk for w in (world, other_world)}
    table = AgentInstance._meta.db_table
    with rls.owner_mode(), connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" DISABLE ROW LEVEL SECURITY')
        cursor.execute(f'DROP POLICY "{rls.POLICY_NAME}" ON "{table}"')
    try:
        as_worker(call_command, "migrate", verbosity=0)
        for tenant_id, agent_id in agents.items():  # the policy is back: each tenant sees its own agent only
            with tenant_scope(tenant_id):
                assert list(AgentInstance.all_tenants.values_list("pk", flat=True)) == [agent_id]
    finally:
        with rls.owner_mode():
            rls.apply(connection)  # whatever happened, the next tests have the policy


def test_flush_command(world, other_world):
    from agents.models import AgentInstance
    from tenants.models import Tenant

    with system_scope():
        for w in (world, other_world):
            AgentFactory(tenant=w.tenant)
        assert Tenant.objects.count() == 2 and AgentInstance.all_tenants.count() == 2
    # Sequences kept, as the test runner's own flush keeps them: ids restarting at 1 would make
    # later tests reuse ids (and the names built from them) that state outside the database
    # (provider health, Redis) still remembers.
    as_worker(call_command, "flush", interactive=False, reset_sequences=False, verbosity=0)
    with system_scope():
        assert (Tenant.objects.count(), AgentInstance.all_tenants.count()) == (0, 0)


# --- evaluation --------------------------------------------------------------------------------


def _dataset_for(world, agent, question: str):
    from evaluation.models import Dataset, DatasetItem

    dataset = Dataset.all_tenants.create(tenant=world.tenant, name="qa")
    DatasetItem.all_tenants.create(tenant=world.tenant, dataset=dataset, input=question,
                                   expected={"facts": [world.tenant.slug]})
    return dataset


def test_experiment_advance(world, other_world, no_enqueue, monkeypatch):
    from evaluation import tasks
    from evaluation.models import ExperimentResult
    from evaluation.services import experiment_create

    resent = []
    monkeypatch.setattr(tasks.experiment_advance, "apply_async", lambda args, **kw: resent.append(args))
    experiments = []
    for w in (world, other_world):
        with tenant_scope(w.tenant.pk):
            agent = AgentFactory(tenant=w.tenant)
            dataset = _dataset_for(w, agent, f"Question of {w.tenant.slug}?")
            experiments.append(experiment_create(dataset=dataset, agent=agent, user=w.admin, start=False))
    for experiment in experiments:
        assert run_task(tasks.experiment_advance, experiment.pk, experiment.tenant_id) == "more"
    assert resent == [(e.pk, e.tenant_id) for e in experiments]  # it goes on after the poll interval
    with system_scope():
        started = {(r.experiment.tenant_id, r.status, r.run.input)
                   for r in ExperimentResult.all_tenants.select_related("experiment", "run")}
    assert started == {(world.tenant.pk, "running", "Question of acme?"),
                       (other_world.tenant.pk, "running", "Question of globex?")}


def test_evaluate_command(world, other_world, fake_llm):
    from evaluation.models import Experiment
    from sessions.runner.host import run_host_shutdown

    fake_llm.script(Reply("acme it is."), Reply("globex it is."))
    for w in (world, other_world):
        with tenant_scope(w.tenant.pk):
            agent = agent_with_route(tenant=w.tenant, base_urls=[fake_llm.base_url], slug="qa-agent")
            _dataset_for(w, agent, "Whose?")
    try:
        for w in (world, other_world):
            as_worker(call_command, "evaluate", "--dataset", "qa", "--agent", "qa-agent", "--tenant", w.tenant.slug,
                      "--fail-under", "1", stdout=io.StringIO())
    finally:
        run_host_shutdown(timeout_seconds=15)
    with system_scope():
        ended = set(Experiment.all_tenants.values_list("tenant_id", "status", "summary__pass_rate"))
    assert ended == {(world.tenant.pk, "completed", 1.0), (other_world.tenant.pk, "completed", 1.0)}


# --- automations: schedules and outbound webhooks ----------------------------------------------


def test_schedules_tick(world, other_world, no_enqueue):
    from automations import tasks
    from automations.models import Schedule, ScheduleSlot

    slot = timezone.now().replace(second=0, microsecond=0)
    with system_scope():
        for w in (world, other_world):
            Schedule.all_tenants.create(tenant=w.tenant, agent=AgentFactory(tenant=w.tenant), owner=w.member,
                                        cron="* * * * *", message="tick", next_slot_at=slot)
    assert run_task(tasks.schedules_tick)["started"] == 2
    with system_scope():
        assert sorted(ScheduleSlot.all_tenants.values_list("tenant_id", flat=True)) == sorted(
            [world.tenant.pk, other_world.tenant.pk])


def _webhook_delivery(w):
    from automations.models import WebhookDelivery, WebhookSubscription

    with system_scope():
        subscription = WebhookSubscription.all_tenants.create(
            tenant=w.tenant, url="http://127.0.0.1:9/unreachable", event_types=["run.failed"], secret_encrypted="")
        return WebhookDelivery.all_tenants.create(
            tenant=w.tenant, subscription=subscription, event_type="run.failed", message_id=f"msg_{w.tenant.pk}",
            payload={}, next_attempt_at=timezone.now(), retry_until=timezone.now() + timedelta(hours=1))


def test_webhook_delivery_attempt(world, other_world, monkeypatch):
    from automations import outbound, tasks

    monkeypatch.setattr(outbound, "_send", lambda delivery: (200, ""))
    for w in (world, other_world):
        delivery = _webhook_delivery(w)
        assert run_task(tasks.delivery_attempt, delivery.pk, w.tenant.pk) == "delivered"


def test_webhook_deliveries_due(world, other_world, monkeypatch):
    from automations import outbound, tasks
    from automations.models import WebhookDelivery

    monkeypatch.setattr(outbound, "_send", lambda delivery: (200, ""))
    ids = [_webhook_delivery(w).pk for w in (world, other_world)]
    assert run_task(tasks.deliveries_due) == 2
    with system_scope():
        assert set(WebhookDelivery.all_tenants.filter(pk__in=ids).values_list("status", flat=True)) == {"delivered"}


def test_webhook_rows_purge(world, other_world):
    from automations import tasks
    from automations.models import WebhookDelivery

    ids = [_webhook_delivery(w).pk for w in (world, other_world)]
    with system_scope():
        WebhookDelivery.all_tenants.filter(pk__in=ids).update(
            status="delivered", created_at=timezone.now() - timedelta(days=60))
    assert run_task(tasks.webhook_rows_purge) == {"deliveries": 2, "inbound": 0}
    with system_scope():
        assert not WebhookDelivery.all_tenants.filter(pk__in=ids).exists()


# --- agents as code, the OAuth server's cleanup -------------------------------------------------


def test_agents_export_and_import_commands(world, other_world, tmp_path):
    from agents.models import AgentInstance

    with system_scope():
        for w in (world, other_world):
            AgentFactory(tenant=w.tenant, name="Coder", system_prompt=f"You help {w.tenant.slug}.")
    exported = io.StringIO()
    as_worker(call_command, "agents_export", "--tenant", world.tenant.slug, stdout=exported)
    text = exported.getvalue()
    assert f"You help {world.tenant.slug}." in text and other_world.tenant.slug not in text
    path = tmp_path / "agents.yaml"
    path.write_text(text.replace(f"You help {world.tenant.slug}.", "You help everyone."))
    as_worker(call_command, "agents_import", str(path), "--tenant", world.tenant.slug, stdout=io.StringIO())
    with system_scope():
        prompts = dict(AgentInstance.all_tenants.filter(name="Coder").values_list("tenant_id", "system_prompt"))
    assert prompts == {world.tenant.pk: "You help everyone.", other_world.tenant.pk: f"You help {other_world.tenant.slug}."}


def test_oauth_cleanup():
    from oauth_server import tasks

    assert set(run_task(tasks.oauth_cleanup)) == {"consents", "grants", "clients"}
