"""Fixtures shared by every app's tests.

- ``tenant`` / ``other_tenant`` with an admin, a member and API tokens each: every
  tenant-owned endpoint is tested from both sides.
- ``fake_llm``: a scripted OpenAI-compatible server on 127.0.0.1 (llm.testing).
- ``celery_worker``: a real Celery worker (in-process thread) on the real Redis broker.
- ``live_server_url``: the real ASGI application (HTTP + WebSocket) served by uvicorn.
- ``all_tenants_scope`` (opt-in: a module's ``pytestmark`` or a test's argument): the body
  may make and inspect any tenant's rows. Without it a test runs outside any tenant scope,
  as production code starts; ``no_scope`` leaves the scope again after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tenants.models import Membership, Role, Tenant
from tenants.scoping import outside_scope, system_scope
from tenants.services import api_token_create, membership_create, tenant_create

pytest_plugins = ["llm.testing_embeddings"]  # embedding_server: the real embedded embedding model

class WorkerTurns:
    """Turns of the pytest-xdist workers of one run, on two lock files in ``directory`` that every
    worker opens: any number of workers may hold a :meth:`shared` turn at once; an
    :meth:`exclusive` turn waits until the shared turns being held end, and no new turn starts
    while it waits or runs (the gate lock). A readers-writer lock across processes (``flock``:
    a lock belongs to an open file, so two instances conflict in one process too)."""

    def __init__(self, directory: Path) -> None:
        self._gate = os.open(directory / "host-exclusive.gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._turn = os.open(directory / "host-exclusive.turn", os.O_RDWR | os.O_CREAT, 0o600)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_SH)
        fcntl.flock(self._turn, fcntl.LOCK_SH)
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._turn, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._turn, fcntl.LOCK_UN)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._gate)
        os.close(self._turn)


@pytest.fixture(scope="session")
def _worker_turns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerTurns | None]:
    """Under pytest-xdist: the turns of this run's workers (their lock files in the run's
    temporary directory, which holds each worker's own); else None."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    turns = WorkerTurns(tmp_path_factory.getbasetemp().parent)
    try:
        yield turns
    finally:
        turns.close()


@pytest.fixture(autouse=True)
def _host_exclusive(request: pytest.FixtureRequest, _worker_turns: WorkerTurns | None) -> Iterator[None]:
    """A test marked ``host_exclusive`` runs while no other xdist worker runs a test: for tests
    that count something host-wide that a test of another worker changes (the sandbox user's
    tasks, which ``RLIMIT_NPROC`` counts). Every other test takes a shared turn
    (:class:`WorkerTurns`). Without xdist it does nothing."""
    if _worker_turns is None:
        yield
    elif request.node.get_closest_marker("host_exclusive") is not None:
        with _worker_turns.exclusive():
            yield
    else:
        with _worker_turns.shared():
            yield


@pytest.fixture(scope="session", autouse=True)
def _clean_test_redis_keys() -> None:
    """Test databases restart their ids; stale replay streams of old runs must not leak in."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{settings.REDIS_KEY_PREFIX}:*", count=1000):
        client.delete(key)


def _flush_by_delete(self) -> None:
    """Empty the test database between transactional tests by ``DELETE``, in place of Django's
    ``flush`` (``TRUNCATE`` of every table, then ``post_migrate``, which writes the content
    types and permissions again and re-applies row-level security): 0.5-0.9 s per test there,
    3-35 ms here (issue 35, CI time).

    One transaction on the owner's connection (:func:`tenants.rls.owner_mode`: the application
    role may not delete the audit log): every Django table locked against writers first (it
    waits for a lingering writer to commit, as ``TRUNCATE``'s lock does, so no late row
    survives), then one ``DELETE`` per table. The order does not matter: Django's foreign keys
    are ``DEFERRABLE INITIALLY DEFERRED`` (agent_platform/tests/test_flush_between_tests.py
    checks the schema has no other). Content types and permissions are kept: migrations wrote
    them and ``post_migrate`` would write the same rows again. A test class with
    ``available_apps`` or ``serialized_rollback`` gets Django's own flush."""
    if self.available_apps is not None or self.serialized_rollback:
        _django_fixture_teardown(self)
        return
    from django.db import connections

    from tenants.rls import owner_mode

    for alias in self._databases_names(include_mirrors=False):
        with owner_mode(alias):
            connection = connections[alias]
            statement = _flush_statements.get(alias)
            if statement is None:
                statement = _flush_statements[alias] = _delete_statement(connection)
            _flush_execute(connection, statement)


_FLUSH_ATTEMPTS = 5


def _flush_execute(connection, statement: str) -> None:
    """Run the flush; PostgreSQL's deadlock detection may pick it as the victim when a lingering
    writer of the test (a worker thread still ending its run) holds one table and waits for
    another the flush locked: then roll back and try again (the writer commits meanwhile)."""
    import time

    from django.db import OperationalError

    for attempt in range(_FLUSH_ATTEMPTS):
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement)
            return
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "40P01" or attempt == _FLUSH_ATTEMPTS - 1:
                raise
            with connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
            time.sleep(0.05 * (attempt + 1))


_flush_statements: dict[str, str] = {}
_FLUSH_KEEPS = frozenset({"django_content_type", "auth_permission"})


def _delete_statement(connection) -> str:
    """``BEGIN; LOCK …; DELETE FROM …; …; COMMIT;`` over every Django table but the kept ones."""
    tables = sorted(set(connection.introspection.django_table_names(only_existing=True, include_views=False))
                    - _FLUSH_KEEPS)
    quoted = [connection.ops.quote_name(table) for table in tables]
    deletes = "".join(f"DELETE FROM {name};" for name in quoted)
    return f"BEGIN;LOCK TABLE {', '.join(quoted)} IN SHARE ROW EXCLUSIVE MODE;{deletes}COMMIT;"


from django.test import TransactionTestCase  # noqa: E402

_django_fixture_teardown = TransactionTestCase._fixture_teardown
TransactionTestCase._fixture_teardown = _flush_by_delete


@pytest.fixture
def all_tenants_scope() -> Iterator[None]:
    """The test body (and the fixtures it asks for after this one) may make and inspect any
    tenant's rows: the system scope, as the sweeper has (tenants/rls.py). Opt-in, per module
    (``pytestmark = pytest.mark.usefixtures("all_tenants_scope")``) or per test: without it a
    test runs outside any scope, as a request, a worker's task or a management command
    starts, so code that forgets to set its own scope finds nothing and the test fails
    (agent_platform/tests/test_tasks_without_scope.py). ``no_scope`` takes it away again."""
    with system_scope():
        yield


@pytest.fixture(autouse=True)
def _event_payloads_checked(monkeypatch) -> Iterator[list[str]]:
    """Every event published while a test runs (by the test, the runner, a worker thread) must
    match its payload class in sessions/event_types.py: a mismatch fails the test at teardown,
    naming the event and the field. Publishing itself is not slowed in production."""
    from sessions import events
    from sessions.event_types import EventPayloadError, validate_event

    mismatches: list[str] = []
    event_body = events.event_body

    def checked_event_body(*, session_id, run_id, type, data):
        body = event_body(session_id=session_id, run_id=run_id, type=type, data=data)
        try:
            validate_event(type, data)
        except EventPayloadError as exc:
            mismatches.append(f"{exc.message} (data: {data!r})")
        return body

    monkeypatch.setattr(events, "event_body", checked_event_body)
    yield mismatches
    if mismatches:
        pytest.fail("events published that do not match sessions/event_types.py:\n" + "\n".join(mismatches))


@pytest.fixture
def no_scope() -> Iterator[None]:
    """The test body runs in no tenant scope (also after ``all_tenants_scope``): the database
    shows it no tenant-owned row."""
    with outside_scope():
        yield


@dataclass
class TenantWorld:
    tenant: Tenant
    admin: object
    member: object
    admin_membership: Membership
    member_membership: Membership
    admin_token: str
    member_token: str

    def client(self, *, admin: bool = False) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.admin_token if admin else self.member_token}")
        return client


def _world(slug: str) -> TenantWorld:
    """A tenant, its admin and member with a token each; made in the system scope (an
    operator's setup), whatever the scope of the test that asks for it."""
    with system_scope():
        tenant = tenant_create(name=slug.title(), slug=slug)
        User = get_user_model()
        admin = User.objects.create_user(username=f"{slug}-admin", password="pw-admin-123", is_staff=True)
        member = User.objects.create_user(username=f"{slug}-user", password="pw-user-123")
        am = membership_create(tenant=tenant, user=admin, role=Role.ADMIN)
        mm = membership_create(tenant=tenant, user=member, role=Role.MEMBER)
        return TenantWorld(
            tenant=tenant, admin=admin, member=member, admin_membership=am, member_membership=mm,
            admin_token=api_token_create(membership=am).raw, member_token=api_token_create(membership=mm).raw,
        )


@pytest.fixture
def world(db) -> TenantWorld:
    return _world("acme")


@pytest.fixture
def other_world(db) -> TenantWorld:
    return _world("globex")


@pytest.fixture
def tenant(world: TenantWorld) -> Tenant:
    return world.tenant


@pytest.fixture
def other_tenant(other_world: TenantWorld) -> Tenant:
    return other_world.tenant


@pytest.fixture
def no_enqueue(monkeypatch):
    """Runs are executed by the test itself, not handed to Celery."""
    import sessions.tests.tools_for_tests  # noqa: F401  (registers test_echo / test_sleep)

    calls = []
    monkeypatch.setattr("sessions.tasks.run_enqueue", lambda run_id, tenant_id=None: calls.append(run_id))
    return calls


@pytest.fixture
def fake_llm():
    from llm.testing import FakeLLMServer

    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def second_fake_llm():
    from llm.testing import FakeLLMServer

    with FakeLLMServer() as server:
        yield server


_worker_held = threading.Event()
_tasks_refused: list[str] = []


def _gate_the_worker(app) -> None:
    """The in-process worker outlives the test that started it, and a later test that drives
    its runs itself (without ``no_enqueue``) had a run claimed under it by this worker (seen in
    CI: "run 412 is held by a live worker"). Each task's body, as the worker's tracer calls it
    (built at the worker's start from ``task.run``), runs only while a test holds
    ``celery_worker``; outside one it does nothing and its name is added to ``_tasks_refused``.
    A task called directly (no request id) or applied eagerly runs as before."""
    for task in app.tasks.values():
        if task.name.startswith("celery."):
            continue

        def gated(*args, _task=task, _run=task.run, **kwargs):
            request = _task.request
            if request.id is not None and not request.is_eager and not _worker_held.is_set():
                _tasks_refused.append(_task.name)
                return None
            return _run(*args, **kwargs)

        task.run = gated


@pytest.fixture(scope="session")
def celery_worker_session(django_db_setup):
    """A real Celery worker thread consuming the test queue on the real Redis broker.

    Set up after the test database (``django_db_setup``), so torn down before it is dropped:
    the worker's run host closes its database connections first. Its tasks run only while a
    test holds ``celery_worker`` (:func:`_gate_the_worker`)."""
    from celery.contrib.testing.worker import start_worker

    from agent_platform.celery import app

    app.loader.import_default_modules()  # every task registered before the gate wraps them
    _gate_the_worker(app)
    app.conf.task_default_queue = settings.CELERY_TASK_DEFAULT_QUEUE
    with app.connection_for_write() as conn:  # tasks left over from an interrupted earlier session
        conn.default_channel.queue_purge(settings.CELERY_TASK_DEFAULT_QUEUE)
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=10,
                      queues=[settings.CELERY_TASK_DEFAULT_QUEUE]) as worker:
        yield worker
    # As Celery's worker_shutdown does in a real worker (start_worker does not send it): the
    # run host's loop lets go of its connections before the test database is dropped.
    from sessions.runner.host import run_host_shutdown

    run_host_shutdown()


@pytest.fixture
def celery_worker(celery_worker_session, transactional_db):
    _worker_held.set()
    yield celery_worker_session
    _worker_held.clear()


@pytest.fixture
def tasks_refused() -> list[str]:
    """Names of the tasks the in-process worker refused to run (no test held it), in order."""
    return _tasks_refused


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout_seconds: float = 10) -> None:
    """SIGTERM ``proc``, wait up to ``timeout_seconds`` for it to exit, then SIGKILL it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_seconds)


@pytest.fixture(scope="session")
def _asgi_server(django_db_setup) -> Iterator[str]:
    """The project's ASGI app served by uvicorn in a thread; set up after the test database, so
    stopped before it is dropped (its consumers hold database connections while they run)."""
    import uvicorn

    from agent_platform.asgi import application
    from agent_platform.web import SERVER_OPTIONS

    port = free_port()
    config = uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            **SERVER_OPTIONS)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-asgi", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the test ASGI server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def live_server_url(_asgi_server: str, transactional_db) -> str:
    """The platform (HTTP + WebSocket) on a real socket; tests using it see committed data."""
    return _asgi_server
