"""The OpenAPI schema is generated cleanly: ``manage.py spectacular --validate --fail-on-warn``
succeeds (no drf-spectacular warning or error, a valid OpenAPI 3 document), every operation
has its own operationId, every GET answers with a documented body, a tenant-scoped foreign
key is an integer id, and a real chat detail answer matches its documented shape.

A warning means part of the API is guessed (a field typed as a string by default, an
operationId suffixed ``_2``) or missing (a view whose serializer cannot be guessed is left
out of the schema): clients generated from the schema and the schemathesis run
(test_schemathesis.py) would then test or call something else than the API.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import schemathesis
import yaml
from django.core.management import CommandError, call_command
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from django.utils import timezone
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.settings import spectacular_settings
from schemathesis import checks

from agents.tests.factories import agent_with_route
from sessions.models import Approval, LLMCall, Run, RunStatus, ToolCall
from sessions.services import chat_session_create, message_post
from tenants.scoping import tenant_scope

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@pytest.fixture(scope="module")
def spectacular_run(tmp_path_factory) -> tuple[str | None, str, Path]:
    """``manage.py spectacular --validate --fail-on-warn --file <tmp>/schema.yml`` run once:
    ``(failure, stderr, path)``: the command's error text (None when it succeeded), what it
    printed on stderr (each warning and error once, then a summary), the schema file."""
    path = tmp_path_factory.mktemp("openapi") / "schema.yml"
    GENERATOR_STATS.reset()  # warnings of an earlier generation in this process must not count
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
        failure = None
    except CommandError as exc:
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        GENERATOR_STATS.reset()
    return failure, stderr.getvalue(), path


@pytest.fixture(scope="module")
def schema() -> dict:
    """The schema as the command generates it (the settings' generator, public, no request),
    warnings silenced; generated apart from the command so that the checks on it run (and
    say what is wrong) even when the command fails."""
    generator = spectacular_settings.DEFAULT_GENERATOR_CLASS()
    with GENERATOR_STATS.silence():
        try:
            return generator.get_schema(request=None, public=True)
        finally:
            GENERATOR_STATS.reset()


def _ref_name(prop: dict) -> str:
    """The component a property refers to (``$ref``, or ``allOf: [$ref]`` when it has meta)."""
    return (prop["allOf"][0] if "allOf" in prop else prop)["$ref"].rsplit("/", 1)[-1]


def _operations(schema: dict) -> list[tuple[str, str, dict]]:
    return [(path, method, op) for path, item in schema["paths"].items()
            for method, op in item.items() if method in HTTP_METHODS]


def test_spectacular_validate_fail_on_warn_succeeds(spectacular_run):
    failure, stderr, path = spectacular_run
    assert failure is None, f"{failure}\n{stderr}"
    assert "Warning" not in stderr and "Error" not in stderr, stderr
    assert "/api/v1/sessions/{session_id}/" in yaml.safe_load(path.read_text())["paths"]


def test_every_operation_has_its_own_operation_id(schema):
    ids = Counter(op["operationId"] for _, _, op in _operations(schema))
    assert not [i for i, n in ids.items() if n > 1]
    # drf-spectacular resolves a collision with a numeral suffix: none must be left.
    assert not [i for i in ids if i.rsplit("_", 1)[-1].isdigit()]


def test_every_get_documents_its_answer_body(schema):
    """A GET that answers 200 "No response body" is one whose serializer was not given."""
    bodiless = [f"GET {p}" for p, method, op in _operations(schema)
                if method == "get" and not op["responses"].get("200", {}).get("content")]
    assert not bodiless


@pytest.mark.parametrize(("component", "field"), [
    ("KnowledgeBaseCreate", "embedding_provider"), ("PatchedKnowledgeBaseUpdate", "embedding_provider"),
    ("Search", "rerank_route"), ("Search", "rerank_provider"),  # plain Serializers: the field's own model says the type
    ("AgentAdmin", "route"), ("Binding", "skill"), ("Skill", "model_route"),  # ModelSerializers
])
def test_a_tenant_related_field_is_a_writable_integer_id(schema, component, field):
    """TenantPrimaryKeyRelatedField (tenants/api/mixins.py) is its model's integer primary key,
    writable, whether or not its serializer has a model."""
    prop = schema["components"]["schemas"][component]["properties"][field]
    assert prop["type"] == "integer" and not prop.get("readOnly"), prop


def test_the_chat_detail_answer_is_documented(schema):
    """GET /sessions/{id}/ (ChatDetailApi) documents what it adds to a session's detail."""
    body = schema["paths"]["/api/v1/sessions/{session_id}/"]["get"]["responses"]["200"]["content"]
    ref = body["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    components = schema["components"]["schemas"]
    detail = components[ref]["properties"]
    assert {"id", "agent", "title", "runs", "usage"} <= set(detail)
    assert "message_mode" in components[_ref_name(detail["agent"])]["properties"]
    usage = components[_ref_name(detail["usage"])]
    assert set(usage["properties"]) == {"llm_calls", "prompt_tokens", "completion_tokens", "cost_usd"}


@contextlib.contextmanager
def _test_connection_kept():
    """As test_schemathesis.py does: requests through the WSGI app must not close the database
    connection that holds the test's transaction. (Django's test client reconnects these
    handlers after each of its requests: enter this after the last one.)"""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.mark.django_db
def test_a_chat_detail_answer_matches_its_schema(world, no_enqueue):
    """A real GET /sessions/{id}/ (a finished run with a tool call, an approval and an LLM
    call) matches the documented ChatDetail: the generated requests of test_schemathesis.py
    rarely name an existing session."""
    with tenant_scope(world.tenant.pk):
        agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
        session = chat_session_create(user=world.member, agent=agent)
        run = message_post(session=session, user=world.member, content="hello")
        Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED, reply="hi", prompt_tokens=12,
                                             completion_tokens=3, cost_usd_micros=40)
        call = ToolCall.objects.create(tenant_id=session.tenant_id, run=run, turn=0, call_id="c1", name="t",
                                       arguments={"x": 1})
        Approval.objects.create(tenant_id=session.tenant_id, run=run, tool_call=call, tool_name="t",
                                arguments={"x": 1}, expires_at=timezone.now() + timedelta(minutes=5))
        LLMCall.objects.create(tenant_id=session.tenant_id, run=run, turn=0, attempt=1, entry_index=0,
                               provider_name="p", model="m", status="succeeded", prompt_tokens=12,
                               completion_tokens=3, cost_usd_micros=40)
    response = Client().get("/api/schema/", {"format": "json"}, HTTP_HOST="localhost")
    loaded = schemathesis.openapi.from_dict(json.loads(response.content))
    loaded.app = get_wsgi_application()
    case = loaded["/api/v1/sessions/{session_id}/"]["GET"].Case(path_parameters={"session_id": session.pk})
    with _test_connection_kept():
        answer = case.call(headers={"Authorization": f"Bearer {world.member_token}"})
    assert answer.status_code == 200, answer.text[:500]
    body = answer.json()
    assert body["usage"]["llm_calls"] == 1 and body["runs"][0]["approvals"] and "message_mode" in body["agent"]
    case.validate_response(answer, checks=[checks.response_schema_conformance, checks.content_type_conformance])
