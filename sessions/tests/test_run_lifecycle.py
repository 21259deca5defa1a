"""The run lifecycle (sessions/runs/): one function per Run status transition.

- The source: nothing outside ``sessions/runs/`` writes ``Run.status`` (ORM keyword, attribute
  assignment, ``update_fields``, hand-written SQL); the checker is tested on snippets of each
  form, and must find the writes the package itself makes.
- The transitions: each publishes exactly its event, after its commit and never before; a
  transition the run's status does not allow writes nothing, publishes nothing and says so.

Real PostgreSQL and Redis; nothing in the product is patched.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.db import transaction

from agent_platform.api_errors import ApplicationError
from agents.tests.factories import agent_with_route
from sessions import runs
from sessions.events import events_since_sync
from sessions.models import Approval, ChatSession, Run, ToolCall
from sessions.runner import database
from sessions.runner.turn import Completed, Failed
from sessions.runs import claim
from sessions.tests.conftest import post_message_sync
from tenants.scoping import tenant_scope

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
LIFECYCLE = ROOT / "sessions" / "runs"

# --- the source: Run.status is written in sessions/runs/ only ----------------------------

_RUN_TABLE = r'(?:\{[\w.]*RUN\}|\{Run\._meta\.db_table\}|agent_sessions_run\b)'
_SQL_STATUS_WRITE = re.compile(
    rf'(?:UPDATE\s+"?{_RUN_TABLE}"?\s+(?:AS\s+\w+\s+)?SET\s+(?:(?!\bWHERE\b).)*?"?status"?\s*='
    rf'|INSERT\s+INTO\s+"?{_RUN_TABLE}"?\s*\([^)]*"?status"?)',
    re.IGNORECASE | re.DOTALL,
)
"""An UPDATE of the run table whose SET clause (up to WHERE) assigns ``status``, or an INSERT
into it naming ``status``."""


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with each ``{expr}`` as written."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
            for part in node.values
        )
    return None


def _root_name(node: ast.AST) -> str | None:
    """``Run`` for ``Run.objects.filter(…).update`` and the like: the name a call chain starts at."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node.id if isinstance(node, ast.Name) else None


def _names_run(node: ast.AST) -> bool:
    """``run``, ``user_run``, ``self.run``…: an expression naming a run."""
    return "run" in ast.unparse(node).lower()


def _writes_status(keywords: list[ast.keyword]) -> bool:
    return any(k.arg == "status" for k in keywords)


def run_status_writes(source: str, where: str) -> list[str]:
    """``where:line: what`` for each write of ``Run.status`` in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "Run" and _writes_status(node.keywords):
                found.append(f"{where}:{line}: Run(status=…)")
            elif (isinstance(func, ast.Attribute) and _root_name(func) == "Run"
                  and func.attr in ("create", "get_or_create", "update_or_create", "bulk_create")):
                found.append(f"{where}:{line}: Run….{func.attr}(…) (a new run has a status)")
            elif (isinstance(func, ast.Attribute) and _root_name(func) == "Run" and func.attr == "update"
                  and _writes_status(node.keywords)):
                found.append(f"{where}:{line}: Run….update(status=…)")
            elif (isinstance(func, ast.Attribute) and func.attr == "save" and _names_run(func.value)
                  and any(k.arg == "update_fields" and "'status'" in ast.unparse(k.value) for k in node.keywords)):
                found.append(f"{where}:{line}: {ast.unparse(func.value)}.save(update_fields=[…status…])")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and t.attr == "status" and (
                        _names_run(t.value) or "RunStatus" in ast.unparse(node.value or ast.Constant(None))
                    ):
                        found.append(f"{where}:{line}: {ast.unparse(t)} = …")
        text = _text(node)
        if text is not None and _SQL_STATUS_WRITE.search(text):
            found.append(f"{where}:{line}: SQL {text[:60]!r}…")
    return found


def _product_sources() -> list[Path]:
    packages = [p for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name not in ("bench", "scripts")]
    return sorted(
        path for package in packages for path in package.rglob("*.py")
        if not {"tests", "migrations"} & set(path.relative_to(ROOT).parts)
    )


def test_no_module_outside_the_lifecycle_package_writes_a_run_status() -> None:
    offenders = [
        write for path in _product_sources() if LIFECYCLE not in path.parents
        for write in run_status_writes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert offenders == [], "Run.status is written only by sessions/runs/ (one function per transition)"


def test_the_checker_sees_the_lifecycle_packages_own_writes() -> None:
    """Not vacuous: the transitions themselves are found, in the ORM and in the SQL."""
    found = [w for path in sorted(LIFECYCLE.glob("*.py")) for w in run_status_writes(path.read_text(), path.name)]
    assert any(w.startswith("statements.py") and "SQL" in w for w in found)  # the claim's and the end's UPDATEs
    assert any(w.startswith("transitions.py") and "run.status = " in w for w in found)  # pause, resume
    assert any(w.startswith("cancellation.py") and "run.status = " in w for w in found)  # a queued run's cancel
    assert any(w.startswith("transitions.py") and ".update(status=" in w for w in found)  # steering
    assert any(w.startswith("ending.py") and ".update(status=" in w for w in found)  # steered runs, sub-runs
    assert any(w.startswith("transitions.py") and ".create(" in w for w in found)  # run_create
    assert any(w.startswith("subruns.py") and ".create(" in w for w in found)  # subrun_open


@pytest.mark.parametrize("snippet", [
    "run.status = RunStatus.FAILED",
    "user_run.status, x = 'queued', 1",
    "Run.objects.filter(pk=1).update(status='failed')",
    "Run.all_tenants.filter(pk=1).update(reply='', status=s)",
    "Run.objects.create(session=s, status='running')",
    "Run.objects.create(session=s, input='hi')",
    "existing.status = RunStatus.RUNNING",
    "Run(session=s, status='running').save()",
    "run.save(update_fields=['status', 'error'])",
    "SQL = f'UPDATE \"{_RUN}\" SET \"error\" = %s, \"status\" = %s WHERE \"id\" = %s'",
    "SQL = f'UPDATE \"{Run._meta.db_table}\" SET \"status\" = %s'",
    "SQL = 'update agent_sessions_run set status = %s'",
    "SQL = f'INSERT INTO \"{sql.RUN}\" (\"tenant_id\", \"status\") VALUES (%s, %s)'",
])
def test_the_checker_finds_each_form_of_a_status_write(snippet: str) -> None:
    assert run_status_writes(snippet, "x.py")


@pytest.mark.parametrize("snippet", [
    "call.status = ToolCallStatus.RUNNING",
    "ToolCall.objects.filter(pk=1).update(status='cancelled')",
    "Run.objects.filter(status='queued').update(superseded_at=now)",
    "SQL = f'UPDATE \"{_RUN}\" SET \"heartbeat_at\" = %s WHERE \"status\" = %s'",
    "SQL = f'UPDATE \"{_TC}\" SET \"status\" = %s'",
    "if run.status == RunStatus.QUEUED: pass",
])
def test_the_checker_leaves_other_writes_and_reads_alone(snippet: str) -> None:
    assert run_status_writes(snippet, "x.py") == []


# --- the source: the lifecycle's events are published in sessions/runs/ only ---------------

LIFECYCLE_EVENTS = frozenset({"tool_call_started", "tool_call_succeeded", "tool_call_failed"})
"""Events of rows :mod:`sessions.runs` writes, besides every ``run_*`` (a run's status, a
sub-run's too), ``compaction_*`` and ``approval_*`` event (``tool_call_progress`` is a tool's
own report, not a row's)."""


def _lifecycle_event(node: ast.AST) -> str | None:
    text = _text(node)
    if text is not None and (text in LIFECYCLE_EVENTS or text.startswith(("run_", "compaction_", "approval_"))):
        return text
    return None


def lifecycle_event_publishes(source: str, where: str) -> list[str]:
    """``where:line: event`` for each call of a publisher (``publish``, ``event_publish``,
    ``event_publish_on_commit``, ``context.publish``, ``publish.nowait``…) whose event type, the first argument or
    ``type=``/``event_type=``, is a literal naming one of the lifecycle's events."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if "publish" not in name:
            continue
        candidates = node.args[:1] + [k.value for k in node.keywords if k.arg in ("type", "event_type")]
        for candidate in candidates:
            event = _lifecycle_event(candidate)
            if event is not None:
                found.append(f"{where}:{node.lineno}: {name}({event!r}, …)")
    return found


def test_no_module_outside_the_lifecycle_package_publishes_a_row_event() -> None:
    offenders = [
        hit for path in _product_sources() if LIFECYCLE not in path.parents
        for hit in lifecycle_event_publishes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert offenders == [], "a run's, tool call's, compaction's or approval's event is published by its write in sessions/runs/"


def test_the_publish_checker_sees_the_lifecycle_packages_own_publishes() -> None:
    """Not vacuous: the records' and the approvals' own publishes are found."""
    found = " ".join(w for path in sorted(LIFECYCLE.glob("*.py"))
                     for w in lifecycle_event_publishes(path.read_text(), path.name))
    for event in ("tool_call_started", "compaction_running", "compaction_completed", "approval_resolved",
                  "run_queued", "run_running", "run_awaiting_approval", "run_cancelled"):
        assert repr(event) in found, event


@pytest.mark.parametrize("snippet", [
    'await publish("tool_call_started", {"tool_call_id": pk})',
    "await state.publish('tool_call_failed', data)",
    'await publish(event_type="tool_call_succeeded", data={})',
    'await publish("compaction_running", {})',
    'await publish("run_running", {"attempt": 1, "skill": "s"})',
    'event_publish_on_commit(session_id=1, run_id=2, type="approval_resolved", data={})',
    'await event_publish(session_id=1, run_id=2, type="approval_requested", data={})',
    'publish.nowait("compaction_completed", {})',
])
def test_the_publish_checker_finds_each_form(snippet: str) -> None:
    assert lifecycle_event_publishes(snippet, "x.py")


@pytest.mark.parametrize("snippet", [
    'await context.publish("tool_call_progress", {})',
    'await publish("model_retry", {"turn": 1})',
    'if event_type == "tool_call_started": pass',
    'await publish(*tool_call_finished_event(pk=1))',
    'log("compaction_running")',
])
def test_the_publish_checker_leaves_other_events_alone(snippet: str) -> None:
    assert lifecycle_event_publishes(snippet, "x.py") == []


# --- the transitions -----------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


def _events(run: Run, event_type: str | None = None) -> list[dict]:
    return [e for e in events_since_sync(session_id=run.session_id, after_seq=0)
            if e["run_id"] == run.pk and (event_type is None or e["type"] == event_type)]


def _queued(world, fake_llm) -> Run:
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    return post_message_sync(agent=agent, user=world.member, content="hi")


def _claimed(world, fake_llm) -> Run:
    run = _queued(world, fake_llm)
    with tenant_scope(world.tenant.pk):
        claim._claim(run.pk)
    return Run.all_tenants.get(pk=run.pk)


@pytestmark_db
def test_run_create_publishes_run_queued_only_once_its_transaction_commits(world, fake_llm, no_enqueue) -> None:
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    with tenant_scope(world.tenant.pk):
        session = ChatSession.objects.create(tenant=world.tenant, agent=agent, user=world.member)
        with transaction.atomic():
            locked = ChatSession.objects.select_for_update().get(pk=session.pk)
            run = runs.run_create(session=locked, user=world.member, content="hello")
            assert _events(run) == [] and no_enqueue == []  # nothing before the commit
    assert [(e["type"], e["data"]) for e in _events(run)] == [("run_queued", {"input": "hello"})]
    assert no_enqueue == [run.pk] and Run.all_tenants.get(pk=run.pk).status == "queued"


@pytestmark_db
def test_a_rolled_back_run_create_publishes_nothing(world, fake_llm, no_enqueue) -> None:
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    with tenant_scope(world.tenant.pk):
        session = ChatSession.objects.create(tenant=world.tenant, agent=agent, user=world.member)
        with pytest.raises(RuntimeError), transaction.atomic():
            runs.run_create(session=ChatSession.objects.select_for_update().get(pk=session.pk), user=world.member,
                            content="hello")
            raise RuntimeError("rolled back")
    assert events_since_sync(session_id=session.pk, after_seq=0) == [] and no_enqueue == []
    assert not Run.all_tenants.filter(session_id=session.pk).exists()


@pytestmark_db
def test_run_claim_publishes_run_running_after_its_commit_and_refuses_a_finished_run(world, fake_llm,
                                                                                    no_enqueue) -> None:
    run = _queued(world, fake_llm)
    seen_by_load = {}

    def load(claimed):  # runs after the claim's commit, before the event
        seen_by_load["status"] = Run.all_tenants.get(pk=claimed.pk).status
        seen_by_load["events"] = [e["type"] for e in _events(run, "run_running")]
        return claimed

    with tenant_scope(world.tenant.pk):
        claimed = asyncio.run(runs.run_claim(run.pk, load=load))
    assert claimed.attempt == 1 and seen_by_load == {"status": "running", "events": []}
    assert [e["data"] for e in _events(run, "run_running")] == [{"attempt": 1}]

    Run.all_tenants.filter(pk=run.pk).update(status="completed")  # (the test's own write)
    with tenant_scope(world.tenant.pk), pytest.raises(runs.RunNotClaimable, match="is completed"):
        asyncio.run(runs.run_claim(run.pk, load=load))
    assert len(_events(run, "run_running")) == 1 and Run.all_tenants.get(pk=run.pk).attempt == 1


class _Recorder:
    """A run's ``publish`` that notes each event with the run's status as another connection
    sees it at that moment (committed or not)."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.events: list[tuple[str, dict, str]] = []

    async def __call__(self, event_type: str, data: dict) -> None:
        status = await sync_to_async(lambda: Run.all_tenants.get(pk=self.run_id).status)()
        self.events.append((event_type, data, status))


@pytestmark_db
@pytest.mark.parametrize("fast", [True, False], ids=["pipelined", "on_a_thread"])
def test_run_finish_publishes_its_end_after_the_commit_and_a_second_end_is_refused(
    world, fake_llm, no_enqueue, fast,
) -> None:
    run = _claimed(world, fake_llm)
    session = ChatSession.all_tenants.get(pk=run.session_id)
    queued = post_message_sync(agent=session.agent, user=world.member, content="next", session=session)
    no_enqueue.clear()
    publish = _Recorder(run.pk)
    with tenant_scope(world.tenant.pk):
        spec = database._spec(runs.ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk))) if fast else None
        finished = asyncio.run(runs.run_finish(run.pk, Completed("done"), publish=publish, spec=spec))
    assert finished.ended and finished.to_start == [queued.pk] and no_enqueue == [queued.pk]
    assert publish.events == [("run_completed", {"reply": "done"}, "completed")]  # committed before it
    row = Run.all_tenants.get(pk=run.pk)
    assert (row.status, row.reply, row.heartbeat_at) == ("completed", "done", None)

    with tenant_scope(world.tenant.pk):  # the run has ended: a second end is a no-op that says so
        again = asyncio.run(runs.run_finish(run.pk, Failed("model_error", "late"), publish=publish, spec=spec))
    assert not again.ended and again.to_start == [] and again.steered == []
    assert len(publish.events) == 1 and no_enqueue == [queued.pk]
    assert Run.all_tenants.get(pk=run.pk).finished_at == row.finished_at
    row.refresh_from_db()
    assert (row.status, row.reply, row.error, row.reason) == ("completed", "done", "", "")


@pytestmark_db
def test_run_finish_of_an_unknown_run_raises(world, other_world, fake_llm, no_enqueue) -> None:
    run = _claimed(world, fake_llm)
    publish = _Recorder(run.pk)
    with tenant_scope(other_world.tenant.pk), pytest.raises(Run.DoesNotExist):
        asyncio.run(runs.run_finish(run.pk, Completed("x"), publish=publish))
    assert publish.events == [] and Run.all_tenants.get(pk=run.pk).status == "running"


def _paused_with_approval(world, fake_llm) -> tuple[Run, Approval]:
    from llm.types import ChatMessage, ToolCallRequest

    run = _claimed(world, fake_llm)
    with tenant_scope(world.tenant.pk):
        spec = database._spec(runs.ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
        message = ChatMessage(role="assistant", content="", tool_calls=(ToolCallRequest("c1", "echo", "{}"),))
        [call] = asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=message))
        approval_id = runs.approval_request(spec=spec, call_pk=call["pk"], kind="approval", tool_name="echo",
                                            arguments={})
    return run, Approval.all_tenants.get(pk=approval_id)


@pytestmark_db
def test_run_pause_publishes_the_pending_approvals_after_its_commit(world, fake_llm, no_enqueue) -> None:
    run, approval = _paused_with_approval(world, fake_llm)
    no_enqueue.clear()
    publish = _Recorder(run.pk)
    with tenant_scope(world.tenant.pk):
        assert asyncio.run(runs.run_pause(run.pk, publish=publish)) is True
    [(event_type, data, status)] = publish.events
    assert (event_type, status) == ("run_awaiting_approval", "awaiting_approval")
    assert [a["approval_id"] for a in data["approvals"]] == [approval.pk]
    assert no_enqueue == []


@pytestmark_db
def test_run_pause_with_nothing_pending_queues_the_run_again_without_an_event(world, fake_llm, no_enqueue) -> None:
    run = _claimed(world, fake_llm)
    no_enqueue.clear()
    publish = _Recorder(run.pk)
    with tenant_scope(world.tenant.pk):
        assert asyncio.run(runs.run_pause(run.pk, publish=publish)) is False
    assert publish.events == [] and no_enqueue == [run.pk] and Run.all_tenants.get(pk=run.pk).status == "queued"


@pytestmark_db
def test_run_resume_queues_a_decided_run_on_commit_and_refuses_one_that_is_not_paused(
    world, fake_llm, no_enqueue,
) -> None:
    from django.utils import timezone

    run, approval = _paused_with_approval(world, fake_llm)
    with tenant_scope(world.tenant.pk):
        asyncio.run(runs.run_pause(run.pk, publish=_Recorder(run.pk)))
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            assert runs.run_resume(run=locked, now=timezone.now()) is False  # an approval is pending
            Approval.objects.filter(pk=approval.pk).update(status="approved")
            assert runs.run_resume(run=locked, now=timezone.now()) is True
            assert all(not e["data"].get("resumed") for e in _events(run, "run_queued"))  # not before the commit
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            assert runs.run_resume(run=locked, now=timezone.now()) is False  # queued now: not paused
    assert [e["data"] for e in _events(run, "run_queued")] == [{"input": "hi"}, {"resumed": True}]
    assert no_enqueue[-1] == run.pk and Run.all_tenants.get(pk=run.pk).status == "queued"


@pytestmark_db
def test_run_finish_unheld_ends_a_paused_run_on_commit_once(world, fake_llm, no_enqueue) -> None:
    run, approval = _paused_with_approval(world, fake_llm)
    with tenant_scope(world.tenant.pk):
        asyncio.run(runs.run_pause(run.pk, publish=_Recorder(run.pk)))
        data = {"error": "gone", "reason": "approval_expired"}
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            assert runs.run_finish_unheld(run=locked, status="failed", error="gone", reason="approval_expired",
                                          event_data=data) is True
            assert _events(run, "run_failed") == []  # not before the commit
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            assert runs.run_finish_unheld(run=locked, status="cancelled", error="x", event_data={"reason": "x"}) is False
    assert [e["data"] for e in _events(run, "run_failed")] == [data] and _events(run, "run_cancelled") == []
    row = Run.all_tenants.get(pk=run.pk)
    assert (row.status, row.reason) == ("failed", "approval_expired")
    assert Approval.all_tenants.get(pk=approval.pk).status == "expired"
    assert ToolCall.all_tenants.get(run_id=run.pk).status == "cancelled"


@pytestmark_db
def test_run_cancel_of_a_queued_run_publishes_on_commit_and_of_a_finished_run_is_a_409(
    world, fake_llm, no_enqueue,
) -> None:
    run = _queued(world, fake_llm)
    with tenant_scope(world.tenant.pk):
        with transaction.atomic():
            assert runs.run_cancel(run=run).status == "cancelled"
            assert _events(run, "run_cancelled") == []
        with pytest.raises(ApplicationError, match="already finished") as refused:
            runs.run_cancel(run=run)
    assert refused.value.status_code == 409
    assert [e["data"] for e in _events(run, "run_cancelled")] == [{"reason": "cancelled_by_user"}]


@pytestmark_db
def test_subrun_finish_is_refused_for_an_attempt_that_no_longer_holds_the_sub_run(world, fake_llm,
                                                                                   no_enqueue) -> None:
    from capabilities.models import Skill
    from llm.types import ChatMessage, ToolCallRequest

    run = _claimed(world, fake_llm)
    skill = Skill.all_tenants.create(tenant=world.tenant, name="helper", description="d", instructions="i")
    with tenant_scope(world.tenant.pk):
        spec = database._spec(runs.ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
        message = ChatMessage(role="assistant", content="", tool_calls=(ToolCallRequest("c1", "helper", "{}"),))
        [call] = asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=message))
        opened = asyncio.run(runs.subrun_open(parent=spec, call_pk=call["pk"], skill_id=skill.pk, skill_name="helper",
                                              task="t", publisher=lambda run_id: _Recorder(run_id)))
        assert opened.created and opened.status == "running"
        resumed = _Recorder(opened.run_id)  # what subrun_open publishes, with the status it has meanwhile
        again = asyncio.run(runs.subrun_open(parent=spec, call_pk=call["pk"], skill_id=skill.pk, skill_name="helper",
                                             task="t", publisher=lambda run_id: resumed))
        assert (again.run_id, again.created, again.attempt) == (opened.run_id, False, 2)
        assert resumed.events == [("run_running", {"attempt": 2, "skill": "helper", "depth": 1, "task": "t"},
                                   "running")]
        publish = _Recorder(opened.run_id)
        assert asyncio.run(runs.subrun_finish(opened.run_id, Completed("old"), publish=publish, attempt=1)) is False
        assert publish.events == []
        assert asyncio.run(runs.subrun_finish(opened.run_id, Completed("new"), publish=publish, attempt=2)) is True
        assert asyncio.run(runs.subrun_finish(opened.run_id, Completed("again"), publish=publish)) is False
    assert publish.events == [("run_completed", {"reply": "new"}, "completed")]
    assert (Run.all_tenants.get(pk=opened.run_id).reply, Run.all_tenants.get(pk=opened.run_id).attempt) == ("new", 2)
    ended = _Recorder(opened.run_id)
    with tenant_scope(world.tenant.pk):  # an ended sub-run is returned as it is, with no event
        state = asyncio.run(runs.subrun_open(parent=spec, call_pk=call["pk"], skill_id=skill.pk, skill_name="helper",
                                             task="t", publisher=lambda run_id: ended))
    assert (state.status, state.reply, state.attempt) == ("completed", "new", 2) and ended.events == []


class _RowRecorder:
    """A run's ``publish`` that notes each event with ``observe()``, read on another
    connection (so only what has committed) at that moment."""

    def __init__(self, observe) -> None:
        self.observe = observe
        self.events: list[tuple[str, dict, object]] = []

    async def __call__(self, event_type: str, data: dict) -> None:
        self.events.append((event_type, data, await sync_to_async(self.observe)()))


def _spec_with_call(world, fake_llm) -> tuple[Run, object, int]:
    from llm.types import ChatMessage, ToolCallRequest

    run = _claimed(world, fake_llm)
    with tenant_scope(world.tenant.pk):
        spec = database._spec(runs.ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
        message = ChatMessage(role="assistant", content="", tool_calls=(ToolCallRequest("c1", "echo", "{}"),))
        [call] = asyncio.run(runs.assistant_message_save(spec=spec, turn=0, message=message))
    return run, spec, call["pk"]


@pytestmark_db
def test_tool_call_start_and_finish_publish_after_their_commit_and_a_second_finish_publishes_nothing(
    world, fake_llm, no_enqueue,
) -> None:
    run, spec, pk = _spec_with_call(world, fake_llm)
    publish = _RowRecorder(lambda: ToolCall.all_tenants.get(pk=pk).status)
    with tenant_scope(world.tenant.pk):
        asyncio.run(runs.tool_call_start(pk=pk, name="echo", arguments={"text": "hi"}, publish=publish))
        assert asyncio.run(runs.tool_call_finish(
            spec=spec, pk=pk, name="echo", status="succeeded", content="echo: hi", data={"n": 1}, error="",
            duration_ms=5, publish=publish,
        )) is True
        assert asyncio.run(runs.tool_call_finish(  # a second attempt's result: refused, not published
            spec=spec, pk=pk, name="echo", status="failed", content="", data=None, error="late", duration_ms=9,
            publish=publish,
        )) is False
    assert publish.events == [
        ("tool_call_started", {"tool_call_id": pk, "name": "echo", "arguments": {"text": "hi"}}, "running"),
        ("tool_call_succeeded", {"tool_call_id": pk, "name": "echo", "result": "echo: hi", "duration_ms": 5,
                                 "data": {"n": 1}}, "succeeded"),
    ]


@pytestmark_db
def test_a_failed_tool_call_publishes_tool_call_failed_with_its_status(world, fake_llm, no_enqueue) -> None:
    run, spec, pk = _spec_with_call(world, fake_llm)
    publish = _RowRecorder(lambda: ToolCall.all_tenants.get(pk=pk).status)
    with tenant_scope(world.tenant.pk):
        assert asyncio.run(runs.tool_call_finish(
            spec=spec, pk=pk, name="echo", status="timed_out", content="", data=None, error="too slow",
            duration_ms=3000, publish=publish,
        )) is True
    assert publish.events == [("tool_call_failed", {"tool_call_id": pk, "name": "echo", "error": "too slow",
                                                    "status": "timed_out", "duration_ms": 3000}, "timed_out")]


@pytestmark_db
def test_compaction_begin_writes_nothing_and_compaction_save_publishes_after_its_commit(
    world, fake_llm, no_enqueue,
) -> None:
    from sessions.models import Compaction

    run, spec, _ = _spec_with_call(world, fake_llm)
    publish = _RowRecorder(lambda: list(Compaction.all_tenants.filter(run_id=run.pk).order_by("id")
                                        .values_list("status", flat=True)))
    with tenant_scope(world.tenant.pk):
        asyncio.run(runs.compaction_begin(attempt=1, tokens_before=900, messages=3, publish=publish))
        failed_id = asyncio.run(runs.compaction_save(spec=spec, attempt=1, status="failed", tokens_before=900,
                                                     error="boom", publish=publish))
        ok_id = asyncio.run(runs.compaction_save(spec=spec, attempt=2, status="succeeded", summary="s",
                                                 messages_summarized=3, tokens_before=900, tokens_after=200,
                                                 publish=publish))
    assert publish.events == [
        ("compaction_running", {"attempt": 1, "tokens_before": 900, "messages": 3}, []),
        ("compaction_completed", {"ok": False, "compaction_id": failed_id, "attempt": 1, "error": "boom"}, ["failed"]),
        ("compaction_completed", {"ok": True, "compaction_id": ok_id, "attempt": 2, "tokens_before": 900,
                                  "tokens_after": 200, "messages": 3}, ["failed", "succeeded"]),
    ]


@pytestmark_db
def test_a_question_after_an_approved_call_is_the_run_users_to_answer_not_the_rules_approvers(
    world, fake_llm, no_enqueue,
) -> None:
    # A binding's rule sends a tool call to the tenant's admins with "approve" on expiry; once
    # approved, the MCP server asks the user a question within the same call (elicitation), and
    # the call's Approval row is reused for it. The rule's approvers and expiry action stayed on
    # it: the user could not answer their own question, and its expiry "approved" it instead of
    # declining. The question's terms are its own: the run's user, a decline on expiry.
    from django.utils import timezone

    from sessions.runs.records import approval_terms

    run, approval = _paused_with_approval(world, fake_llm)
    rule = {"approvers": {"roles": ["admin"]}, "on_timeout": "approve", "timeout_seconds": 600}
    Approval.all_tenants.filter(pk=approval.pk).update(
        kind="tool_call", status="approved", decided_at=timezone.now(), **approval_terms(rule, now=timezone.now()))
    assert Approval.all_tenants.get(pk=approval.pk).approvers["roles"] == ["admin"]
    with tenant_scope(world.tenant.pk):
        spec = database._spec(runs.ClaimedRun.of(Run.objects.select_related("session").get(pk=run.pk)))
        again = runs.approval_request(spec=spec, call_pk=approval.tool_call_id, kind="elicitation", tool_name="echo",
                                      arguments={}, question="Which account?", elicitation={"request": {"mode": "form"}},
                                      rule={"timeout_seconds": 120})
    row = Approval.all_tenants.get(pk=again)
    assert again == approval.pk and (row.kind, row.status, row.question) == ("elicitation", "pending", "Which account?")
    assert (row.approvers, row.on_timeout) == ({}, "")
    assert 110 <= (row.expires_at - timezone.now()).total_seconds() <= 120
