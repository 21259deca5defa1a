"""The API contract's input rules and schema shapes (issue 23, L5): names must be strings,
an approval takes exactly one of ``decision``/``answer``, and the OpenAPI schema describes
what the list endpoints really answer and documents the error answers."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.mark.parametrize("name", [0, True, ["x"], {"a": 1}])
def test_a_token_name_must_be_a_string(world, name):
    response = world.client().post("/api/v1/tokens/", {"name": name}, format="json")
    assert response.status_code == 400
    assert response.json() == {"message": "Validation error.", "extra": {"fields": {"name": ["Not a valid string."]}}}


@pytest.mark.parametrize("name", [0, False])
def test_a_pairing_name_must_be_a_string(name):
    response = APIClient().post("/api/v1/browser/pairings/", {"name": name}, format="json")
    assert response.status_code == 400
    assert response.json()["extra"] == {"fields": {"name": ["Not a valid string."]}}
    assert APIClient().post("/api/v1/browser/pairings/", {"name": "laptop"}, format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_an_approval_takes_exactly_one_of_decision_and_answer(world, fake_llm, no_enqueue):
    from llm.testing import Reply, ToolCalls
    from sessions.tests.conftest import post_message_sync
    from sessions.tests.test_approvals import _agent, _approvals, run_now

    agent = _agent(world, fake_llm, ("ask_user", []))
    fake_llm.script(ToolCalls([("ask_user", {"question": "Which city?"})]), Reply("Tokyo it is."))
    run = post_message_sync(agent=agent, user=world.member, content="Weather please")
    run_now(run.pk)
    [question] = _approvals(run.pk)
    client = world.client()
    url = f"/api/v1/approvals/{question.pk}/"
    for body in ({"decision": "approve", "answer": "Tokyo"}, {}, {"reason": "why"}):
        bad = client.post(url, body, format="json")
        assert bad.status_code == 400, (body, bad.json())
        assert bad.json()["extra"]["fields"]["non_field_errors"] == [
            "Send exactly one of decision (a tool call), answer (a question) or action (an MCP server's request "
            "for input)."]
    assert client.post(url, {"answer": 7}, format="json").status_code == 400
    assert client.post(url, {"answer": "Tokyo"}, format="json").status_code == 200


def _schema() -> dict:
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def _ok_schema(schema: dict, path: str, method: str) -> dict:
    responses = schema["paths"][path][method]["responses"]
    body = (responses.get("200") or responses["201"])["content"]["application/json"]["schema"]
    if "$ref" in body:
        body = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    return body


def test_the_schema_says_what_the_list_endpoints_answer(world):
    schema = _schema()
    for path in ("/api/v1/sessions/", "/api/v1/documents/", "/api/v1/runs/{run_id}/activities/"):
        body = _ok_schema(schema, path, "get")
        assert body["type"] == "object" and set(body["properties"]) == {"count", "next", "previous", "results"}, path
    devices = _ok_schema(schema, "/api/v1/browser/devices/", "get")
    assert devices["type"] == "object" and set(devices["properties"]) == {"results"}
    for path, method in (("/api/v1/admin/routes/{id}/test/", "post"), ("/api/v1/admin/routes/{id}/health/", "get")):
        assert _ok_schema(schema, path, method)["type"] == "array", path
    # the answers really have that shape
    client = world.client()
    assert set(client.get("/api/v1/sessions/").json()) == {"count", "next", "previous", "results"}
    assert set(client.get("/api/v1/documents/").json()) == {"count", "next", "previous", "results"}
    assert set(client.get("/api/v1/browser/devices/").json()) == {"results"}


def test_the_schema_documents_the_error_answers():
    schema = _schema()
    assert schema["components"]["schemas"]["Error"]["required"] == ["message", "extra"]
    error = {"$ref": "#/components/schemas/Error"}
    tokens = schema["paths"]["/api/v1/tokens/"]
    for code in ("400", "401", "403", "404", "413", "415", "429"):
        assert tokens["post"]["responses"][code]["content"]["application/json"]["schema"] == error, code
    assert "413" not in tokens["get"]["responses"]
    assert schema["paths"]["/api/v1/admin/agents/{id}/"]["delete"]["responses"]["409"]["content"][
        "application/json"]["schema"] == error
    assert "requestBody" not in schema["paths"]["/api/v1/approvals/{approval_id}/"]["get"]
