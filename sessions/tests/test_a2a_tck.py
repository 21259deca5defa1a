"""The mandatory cases of the A2A TCK (github.com/a2aproject/a2a-tck, ``tests/mandatory/``, read at
commit 410ba92) ported to pytest, against the live server at ``/a2a/<slug>/`` (CI cannot reach
GitHub, and the TCK drives one SUT URL of its own). Each case names its TCK source as
``# TCK <file>::<test>``; the JSON-RPC and HTTP+JSON bindings both run the transport-agnostic
cases (the TCK's ``transport_*`` helpers pick one binding; here ``binding`` is a parameter). The
requests are the TCK's own raw JSON bodies, sent with httpx as the TCK sends them with requests.

Cases that cannot apply to this server are skipped with the reason (gRPC; TLS and certificate
checks of a server that the platform's reverse proxy terminates; in-task authentication,
which no agent of ours asks for). Where a TCK case assumes behaviour the 1.0 specification
forbids (a follow-up message to a completed task), the port checks the specification's answer
and says so.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Delay, Reply, ToolCalls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

JSONRPC, REST = "JSONRPC", "HTTP+JSON"
BINDINGS = pytest.mark.parametrize("binding", [JSONRPC, REST])
ACTIVE = {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_COMPLETED"}


class Sut:
    """The TCK's ``SUTClient`` for one agent: raw JSON-RPC and HTTP+JSON calls with a bearer token.

    :meth:`call` answers as the TCK's transport helpers do: ``{"result": …}`` or
    ``{"error": {"code": <JSON-RPC code>, …}}``; an HTTP+JSON error's code is the JSON-RPC code
    of its ``reason`` (``TASK_NOT_FOUND`` → -32001), its HTTP status kept as ``"http"``."""

    def __init__(self, base: str, token: str) -> None:
        self.url = f"{base}/a2a/helper/"
        self.headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}

    def raw(self, body: str | bytes | dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        content = json.dumps(body) if isinstance(body, dict) else body
        return httpx.post(self.url, content=content, timeout=30,
                          headers={"Content-Type": "application/json", **self.headers, **(headers or {})})

    def rpc(self, method: str, params: Any, *, request_id: Any = None) -> dict[str, Any]:
        response = self.raw({"jsonrpc": "2.0", "id": request_id or str(uuid.uuid4()), "method": method,
                             "params": params})
        assert response.status_code == 200, response.text  # JSON-RPC errors are answered with 200
        return response.json()

    def rest(self, verb: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None) -> dict[str, Any]:
        response = httpx.request(verb, f"{self.url}rest{path}", headers=self.headers, json=body, params=query,
                                 timeout=30)
        answer = response.json()
        if response.status_code < 400:
            return {"result": answer, "http": response.status_code}
        reasons = [d.get("reason") for d in answer.get("error", {}).get("details", []) if isinstance(d, dict)]
        codes = [JSON_RPC_ERROR_CODE_MAP[A2A_REASON_TO_ERROR[r]] for r in reasons if r in A2A_REASON_TO_ERROR]
        error = answer.get("error", {})
        return {"error": {**error, "code": codes[0] if codes else None, "http_code": error.get("code")},
                "http": response.status_code}

    def call(self, binding: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if binding == JSONRPC:
            return self.rpc(method, params)
        task_id = params.get("id", "")
        query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items() if k != "id"}
        match method:
            case "SendMessage":
                return self.rest("POST", "/message:send", body=params)
            case "GetTask":
                return self.rest("GET", f"/tasks/{task_id}", query=query)
            case "CancelTask":
                return self.rest("POST", f"/tasks/{task_id}:cancel")
            case "ListTasks":
                return self.rest("GET", "/tasks", query=query)
            case "GetExtendedAgentCard":
                return self.rest("GET", "/extendedAgentCard")
            case "CreateTaskPushNotificationConfig":
                return self.rest("POST", f"/tasks/{params['taskId']}/pushNotificationConfigs", body=params)
        raise AssertionError(method)

    def send(self, binding: str, text: str, **message: Any) -> dict[str, Any]:
        """SendMessage with the TCK's ``valid_text_message_params``; the answer's task."""
        answer = self.call(binding, "SendMessage", {"message": {
            "messageId": f"text-{uuid.uuid4()}", "role": "ROLE_USER", "parts": [{"text": text}], **message}})
        assert "result" in answer, answer
        return answer["result"]["task"]

    def card(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}.well-known/agent-card.json", headers=self.headers, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()


def _text(role: str = "ROLE_USER", text: str = "Hello from TCK!") -> dict[str, Any]:
    return {"message": {"messageId": f"text-{uuid.uuid4()}", "role": role, "parts": [{"text": text}]}}


@pytest.fixture
def sut(world, fake_llm, celery_worker, live_server_url) -> Sut:
    """Agent ``helper`` of ``world`` on the fake model, which answers "ok" unless scripted."""
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper",
                     description="The TCK's system under test.")
    fake_llm.respond(lambda body: Reply("ok"))
    return Sut(live_server_url, world.member_token)


# -- tests/mandatory/jsonrpc ---------------------------------------------------------------------


def test_tck_json_rpc_compliance(sut):
    # TCK jsonrpc/test_json_rpc_compliance.py::test_rejects_malformed_json
    malformed = '{"jsonrpc": "2.0", "method": "SendMessage", "params": {"foo": "bar"}'
    assert sut.raw(malformed).json()["error"]["code"] == -32700
    # TCK jsonrpc/test_json_rpc_compliance.py::test_rejects_invalid_json_rpc_requests (its five rows)
    for invalid, expected in [
        ({"jsonrpc": "aaa", "method": "SendMessage", "params": {}}, -32600),
        ({"jsonrpc": "2.0", "params": {}}, -32600),
        ({"jsonrpc": "2.0", "method": "SendMessageXXX", "id": "3", "params": {}}, -32601),
        ({"jsonrpc": "2.0", "method": "SendMessage", "params": {}, "id": {"bad": "type"}}, -32600),
        ({"jsonrpc": "2.0", "method": "SendMessage", "id": "4", "params": {"": "not_a_dict"}}, -32602),
    ]:
        response = sut.raw(invalid)
        assert response.status_code == 200 and response.json()["error"]["code"] == expected, (invalid, response.text)
    # TCK jsonrpc/test_json_rpc_compliance.py::test_rejects_unknown_method
    unknown = sut.rpc("nonexistent/method", {}, request_id="u1")
    assert unknown["error"]["code"] == -32601 and unknown["id"] == "u1" and unknown["jsonrpc"] == "2.0"
    # TCK jsonrpc/test_json_rpc_compliance.py::test_rejects_invalid_params
    assert sut.rpc("SendMessage", {"message": {"parts": "invalid"}})["error"]["code"] == -32602


def test_tck_protocol_violations(sut):
    # TCK jsonrpc/test_protocol_violations.py::test_duplicate_request_ids
    fixed = f"duplicate-{uuid.uuid4()}"
    first = sut.rpc("SendMessage", _text(), request_id=fixed)
    second = sut.rpc("SendMessage", _text(text="This is a different message with the same ID"), request_id=fixed)
    assert "result" in first and first["id"] == fixed
    assert second["jsonrpc"] == "2.0" and second["id"] == fixed
    # TCK jsonrpc/test_protocol_violations.py::test_invalid_jsonrpc_version
    bad_version = sut.raw({"jsonrpc": "1.0", "id": "v1", "method": "SendMessage", "params": _text()}).json()
    assert bad_version["error"]["code"] == -32600 and bad_version["id"] == "v1"
    # TCK jsonrpc/test_protocol_violations.py::test_missing_method_field
    no_method = sut.raw({"jsonrpc": "2.0", "id": "m1", "params": _text()}).json()
    assert no_method["error"]["code"] == -32600 and no_method["id"] == "m1"
    # TCK jsonrpc/test_protocol_violations.py::test_raw_invalid_json
    raw = sut.raw('{"jsonrpc": "2.0", "method": "SendMessage", "params": {"unclosed_object": true')
    assert raw.status_code == 400 or raw.json()["error"]["code"] == -32700


@BINDINGS
def test_tck_a2a_error_codes(binding, sut):
    # TCK jsonrpc/test_a2a_error_codes.py::test_push_notification_not_supported_error_32003 (and
    # test_a2a_error_codes_enhanced.py::…_32003_enhanced): the TCK skips it when the card says
    # pushNotifications true, as it does; the operation then stores the config (a public IP
    # literal: no DNS lookup in CI; the task has ended, so nothing is sent to it)
    assert sut.card()["capabilities"]["pushNotifications"] is True
    task = sut.send(binding, "a task for a push config")
    push = sut.call(binding, "CreateTaskPushNotificationConfig",
                    {"taskId": task["id"], "url": "https://93.184.215.14/webhook"})
    assert (push["result"]["taskId"], push["result"]["url"]) == (task["id"], "https://93.184.215.14/webhook"), push
    # TCK jsonrpc/test_a2a_error_codes.py::test_unsupported_operation_error_32004 (and …_enhanced):
    # the TCK's scenarios (streaming without the capability; odd configuration) do not apply to an
    # agent that streams, so it skips them; what this agent does not support is -32004: a message
    # to a finished task.
    terminal = sut.call(binding, "SendMessage", {"message": {**_text()["message"], "taskId": task["id"]}})
    assert terminal["error"]["code"] == -32004, terminal
    # TCK jsonrpc/test_a2a_error_codes.py::test_content_type_not_supported_error_32005 (and …_enhanced)
    for part in ({"raw": "VGVzdCBkYXRh", "filename": "test.unsupported",
                  "mediaType": "application/x-totally-unsupported-format"},
                 {"url": "https://example.com/test.txt", "filename": "test.txt", "mediaType": "text/plain"}):
        unsupported = sut.call(binding, "SendMessage", {"message": {
            "messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": [{"text": "Please process this file"},
                                                                               part]}})
        assert unsupported["error"]["code"] == -32005, unsupported


@pytest.mark.skip(reason="TCK jsonrpc/test_a2a_error_codes.py::test_invalid_agent_response_error_32006 (and "
                         "…_enhanced): the TCK itself skips it unless the SUT's agent can be made to answer "
                         "badly; our answers are built by the server from the run, never relayed from a model")
def test_tck_invalid_agent_response_error_32006():
    """Not applicable (see the skip reason)."""


def test_tck_error_code_coverage_summary():
    # TCK jsonrpc/test_a2a_error_codes.py::test_a2a_error_code_coverage_summary (and
    # test_a2a_error_codes_enhanced.py::test_a2a_error_code_coverage_enhanced): the codes the
    # server answers with are the specification's
    from a2a.utils import errors

    assert {JSON_RPC_ERROR_CODE_MAP[getattr(errors, name)] for name in (
        "TaskNotFoundError", "TaskNotCancelableError", "PushNotificationNotSupportedError",
        "UnsupportedOperationError", "ContentTypeNotSupportedError", "InvalidAgentResponseError")} == {
        -32001, -32002, -32003, -32004, -32005, -32006}


# -- tests/mandatory/protocol --------------------------------------------------------------------


def test_tck_agent_card(sut):
    card = sut.card()
    # TCK protocol/test_agent_card.py::test_agent_card_available
    assert isinstance(card, dict)
    # TCK protocol/test_agent_card.py::test_mandatory_fields_present,
    # protocol/test_agent_card_mandatory.py::test_agent_card_mandatory_fields
    for field in ("capabilities", "defaultInputModes", "defaultOutputModes", "description", "name", "skills",
                  "version"):
        assert card.get(field) is not None, field
    # TCK protocol/test_agent_card.py::test_mandatory_field_types
    assert all(isinstance(card[f], str) for f in ("name", "description", "version"))
    assert isinstance(card["capabilities"], dict)
    assert all(isinstance(card[f], list) for f in ("defaultInputModes", "defaultOutputModes", "skills"))
    # TCK protocol/test_agent_card_mandatory.py::test_agent_card_capabilities_mandatory
    assert isinstance(card["capabilities"], dict)
    # TCK protocol/test_agent_card_mandatory.py::test_agent_card_skills_mandatory
    assert card["skills"] and all(skill.get(f) is not None for skill in card["skills"]
                                  for f in ("id", "name", "description", "tags"))
    # TCK protocol/test_agent_card_mandatory.py::test_agent_card_input_output_modes_mandatory
    for field in ("defaultInputModes", "defaultOutputModes"):
        assert all(isinstance(mode, str) and mode.strip() for mode in card[field]), field
    # TCK protocol/test_agent_card_mandatory.py::test_agent_card_basic_info_mandatory
    assert all(card[f].strip() for f in ("name", "description", "version"))
    # TCK authentication/test_auth_enforcement.py::test_authentication_scheme_consistency
    # (the TCK asserts one key per scheme, the 1.0 oneof; the a2a-sdk's card adds the 0.3 card's
    # fields of the same scheme beside it for older clients, as issue 36 asks: those are allowed)
    one_of = {"apiKeySecurityScheme", "httpAuthSecurityScheme", "oauth2SecurityScheme",
              "openIdConnectSecurityScheme", "mtlsSecurityScheme"}
    for name, scheme in card["securitySchemes"].items():
        [kind] = set(scheme) & one_of
        assert set(scheme) - one_of <= {"type", "scheme", "bearerFormat", "description"}, name
        assert kind == "httpAuthSecurityScheme" and scheme[kind]["scheme"].lower() == "bearer"
    declared = set(card["securitySchemes"])
    assert card["securityRequirements"] and all(set(r["schemes"]) <= declared for r in card["securityRequirements"])


def test_tck_agent_card_of_an_agent_without_a_description(world, live_server_url):
    # TCK protocol/test_agent_card_mandatory.py::test_agent_card_basic_info_mandatory: the
    # description is never empty, also for an agent the admin gave none
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper", description="")
    card = Sut(live_server_url, world.member_token).card()
    assert card["description"].strip() and all(s["description"].strip() for s in card["skills"])


@BINDINGS
def test_tck_message_send(binding, sut, fake_llm):
    # TCK protocol/test_message_send_method.py::test_message_send_valid_text
    task = sut.send(binding, "Hello from TCK!")
    assert task["status"]["state"] in ACTIVE
    # TCK protocol/test_message_send_method.py::test_message_send_invalid_params
    invalid = sut.call(binding, "SendMessage", {"message": {"kind": "message"}})
    assert invalid["error"]["code"] == -32602, invalid
    # TCK protocol/test_message_send_method.py::test_message_send_continue_task: the 1.0
    # specification makes a completed task immutable (a follow-up to it is -32004, see
    # test_tck_a2a_error_codes), so the task continued here is one waiting for input
    agent = __import__("agents.models", fromlist=["AgentInstance"]).AgentInstance.all_tenants.get(slug="helper")
    bind_builtin(agent, "ask_user")
    fake_llm.script(ToolCalls([("ask_user", {"question": "Which city?"})]), Reply("Tokyo it is."))
    asked = sut.send(binding, "plan a trip")
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    continued = sut.send(binding, "Follow-up message for the existing task", taskId=asked["id"])
    assert continued["id"] == asked["id"] and continued["status"]["state"] in ACTIVE


@BINDINGS
def test_tck_tasks_get(binding, sut):
    created = sut.send(binding, "Task for get test")
    # TCK protocol/test_tasks_get_method.py::test_tasks_get_valid
    got = sut.call(binding, "GetTask", {"id": created["id"]})["result"]
    assert got["id"] == created["id"] and "status" in got
    # TCK protocol/test_tasks_get_method.py::test_tasks_get_with_history_length
    limited = sut.call(binding, "GetTask", {"id": created["id"], "historyLength": 1})["result"]
    assert limited["id"] == created["id"] and "history" in limited
    # TCK protocol/test_tasks_get_method.py::test_tasks_get_nonexistent (its id is not a number)
    for missing in ("nonexistent-task-id", "999999999"):
        assert sut.call(binding, "GetTask", {"id": missing})["error"]["code"] == -32001


@BINDINGS
def test_tck_task_history_length(binding, sut):
    # TCK protocol/test_state_transitions.py::test_task_history_length: the TCK adds three
    # follow-ups to a completed task, which 1.0 forbids (-32004); the history here is the
    # conversation's (the context's earlier turns, then this task's message and reply)
    first = sut.send(binding, "Initial message for history test")
    task = sut.send(binding, "Follow-up message 1 for history test", contextId=first["contextId"])
    full = sut.call(binding, "GetTask", {"id": task["id"]})["result"].get("history", [])
    limited = sut.call(binding, "GetTask", {"id": task["id"], "historyLength": 2})["result"].get("history", [])
    assert len(limited) == 2 and len(full) >= len(limited)
    assert limited == full[-2:]


@BINDINGS
def test_tck_tasks_cancel(binding, sut, fake_llm):
    fake_llm.respond(None)
    fake_llm.script(Delay(30, Reply("too late")))
    created = sut.call(binding, "SendMessage", {**_text(text="Task for cancel test"),
                                                "configuration": {"returnImmediately": True}})["result"]["task"]
    # TCK protocol/test_tasks_cancel_method.py::test_tasks_cancel_valid
    cancelled = sut.call(binding, "CancelTask", {"id": created["id"]})["result"]
    assert cancelled["id"] == created["id"] and cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    # TCK protocol/test_tasks_cancel_method.py::test_tasks_cancel_nonexistent
    assert sut.call(binding, "CancelTask", {"id": "nonexistent-task-id"})["error"]["code"] == -32001


def _list(sut: Sut, binding: str, **params: Any) -> dict[str, Any]:
    return sut.call(binding, "ListTasks", params)


@BINDINGS
def test_tck_tasks_list(binding, sut):
    # TCK protocol/test_tasks_list_method.py::test_list_tasks_empty_when_none_exist
    empty = _list(sut, binding)["result"]
    assert empty.get("tasks", []) == [] and empty.get("totalSize", 0) == 0
    before = datetime.now(UTC).isoformat()
    time.sleep(0.1)
    a = sut.send(binding, "Task A")
    b = sut.send(binding, "Task B", contextId=a["contextId"])
    c = sut.send(binding, "Task C")
    # TCK protocol/test_tasks_list_method.py::test_list_all_tasks,
    # protocol/test_a2a_v030_new_methods.py::test_tasks_list_with_existing_tasks
    everything = _list(sut, binding)["result"]
    assert {t["id"] for t in everything["tasks"]} == {a["id"], b["id"], c["id"]}
    # TCK protocol/test_tasks_list_method.py::test_list_tasks_validates_required_fields
    assert all({"id", "contextId", "status"} <= set(t) and "state" in t["status"] for t in everything["tasks"])
    # TCK protocol/test_tasks_list_method.py::test_list_tasks_sorted_by_timestamp_descending
    stamps = [t["status"]["timestamp"] for t in everything["tasks"]]
    assert stamps == sorted(stamps, reverse=True) and [t["id"] for t in everything["tasks"]] == [
        c["id"], b["id"], a["id"]]
    # TCK protocol/test_tasks_list_method.py::test_filter_by_context_id
    in_context = _list(sut, binding, contextId=a["contextId"])["result"]
    assert [t["id"] for t in in_context["tasks"]] == [b["id"], a["id"]]
    # TCK protocol/test_tasks_list_method.py::test_filter_by_status
    completed = _list(sut, binding, status="TASK_STATE_COMPLETED")["result"]
    assert len(completed["tasks"]) == 3 and all(t["status"]["state"] == "TASK_STATE_COMPLETED"
                                                for t in completed["tasks"])
    assert _list(sut, binding, status="TASK_STATE_WORKING")["result"].get("tasks", []) == []
    # TCK protocol/test_tasks_list_method.py::test_filter_by_last_updated_after
    after = _list(sut, binding, statusTimestampAfter=before)["result"]
    assert {a["id"], b["id"], c["id"]} <= {t["id"] for t in after["tasks"]}
    later = datetime.now(UTC).isoformat()
    assert _list(sut, binding, statusTimestampAfter=later)["result"].get("tasks", []) == []
    # TCK protocol/test_tasks_list_method.py::test_combined_filters
    combined = _list(sut, binding, contextId=a["contextId"], status="TASK_STATE_COMPLETED")["result"]
    assert [t["id"] for t in combined["tasks"]] == [b["id"], a["id"]]
    # TCK protocol/test_tasks_list_method.py::test_default_page_size (fewer than 50 tasks): all are
    # returned. The TCK also asserts pageSize == totalSize here; the specification's ListTasks
    # example (1 task, "pageSize": 10) and the a2a-sdk's own task stores answer the page size
    # used (the default, 50), as this server does
    assert everything["totalSize"] == 3 and len(everything["tasks"]) == 3 and everything["pageSize"] == 50
    # TCK protocol/test_tasks_list_method.py::test_custom_page_size, ::test_page_token_navigation,
    # ::test_last_page_detection, ::test_total_size_accuracy
    page1 = _list(sut, binding, pageSize=2)["result"]
    page2 = _list(sut, binding, pageSize=2, pageToken=page1["nextPageToken"])["result"]
    assert len(page1["tasks"]) == 2 and page1["nextPageToken"] and page1["totalSize"] == 3
    assert [t["id"] for t in page1["tasks"] + page2["tasks"]] == [c["id"], b["id"], a["id"]]
    assert not page2.get("nextPageToken") and page2["totalSize"] == 3
    # TCK protocol/test_tasks_list_method.py::test_history_length_zero, ::test_history_length_custom,
    # ::test_history_length_exceeds_actual
    assert all(len(t.get("history", [])) == 0 for t in _list(sut, binding, historyLength=0)["result"]["tasks"])
    assert all(len(t.get("history", [])) <= 1 for t in _list(sut, binding, historyLength=1)["result"]["tasks"])
    full = sut.call(binding, "GetTask", {"id": c["id"]})["result"]["history"]
    [huge] = [t for t in _list(sut, binding, historyLength=100)["result"]["tasks"] if t["id"] == c["id"]]
    def said(history):
        return [(m["messageId"], m["role"], [p["text"] for p in m["parts"]]) for m in history]

    assert said(huge["history"]) == said(full) and len(full) == 2
    # TCK protocol/test_tasks_list_method.py::test_artifacts_excluded_by_default,
    # ::test_artifacts_included_when_requested
    assert all(not t.get("artifacts") for t in everything["tasks"])
    assert all(t.get("artifacts") for t in _list(sut, binding, includeArtifacts=True)["result"]["tasks"])
    # TCK protocol/test_tasks_list_method.py::test_invalid_page_token_error, ::test_invalid_status_error,
    # ::test_negative_page_size_error, ::test_zero_page_size_error, ::test_out_of_range_page_size_error,
    # ::test_negative_history_length_error, ::test_invalid_timestamp_error
    for bad in ({"pageToken": "invalid-token-xyz"}, {"status": "INVALID_STATUS"}, {"pageSize": -1},
                {"pageSize": 0}, {"pageSize": 101}, {"historyLength": -1}, {"statusTimestampAfter": "-1"}):
        answer = _list(sut, binding, **bad)
        if binding == JSONRPC:
            assert answer.get("error", {}).get("code") == -32602, (bad, answer)
        else:  # the TCK's REST client reads any 400 as -32602 (tck/message_utils.py::handle_http_error_response);
            # a timestamp the SDK cannot parse is its INVALID_REQUEST, the same 400 INVALID_ARGUMENT
            assert answer["http"] == 400 and answer["error"]["status"] == "INVALID_ARGUMENT", (bad, answer)
            assert answer["error"]["code"] in (-32602, -32600), (bad, answer)


def test_tck_default_page_size_is_50(world, fake_llm, celery_worker, live_server_url):
    # TCK protocol/test_tasks_list_method.py::test_default_page_size_is_50 (the TCK makes its 60
    # tasks through SendMessage; here they are made as runs of the caller with the agent, the
    # rows ListTasks reads, to keep the test quick)
    from sessions.models import ChatSession, Run

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    Run.all_tenants.bulk_create([Run(tenant=world.tenant, session=session, user=world.member, input=f"Task {i}",
                                     status="completed") for i in range(60)])
    sut = Sut(live_server_url, world.member_token)
    for binding in (JSONRPC, REST):
        result = _list(sut, binding, contextId=str(session.pk))["result"]
        assert (result["totalSize"], result["pageSize"], len(result["tasks"])) == (60, 50, 50)
        assert result["nextPageToken"] != ""


def test_tck_method_mapping_and_transport_features(sut):
    # TCK protocol/test_a2a_v030_new_methods.py::test_core_method_mapping_compliance,
    # ::test_transport_specific_method_naming, ::test_jsonrpc_specific_features,
    # ::test_rest_specific_features; protocol/test_a2a_v030_transport_compliance.py::
    # test_transport_compliance_validation, ::test_required_method_availability,
    # ::test_transport_specific_features, ::test_multi_transport_method_mapping,
    # ::test_comprehensive_a2a_v030_compliance: each binding the card declares answers the core
    # methods under its own names (JSON-RPC: PascalCase methods; HTTP+JSON: the 1.0 paths)
    card = sut.card()
    bindings = {i["protocolBinding"] for i in card["supportedInterfaces"] if i["protocolVersion"] == "1.0"}
    assert bindings == {JSONRPC, REST}
    task = sut.send(JSONRPC, "mapping")
    for binding in (JSONRPC, REST):
        assert sut.call(binding, "GetTask", {"id": task["id"]})["result"]["id"] == task["id"]
        assert "tasks" in sut.call(binding, "ListTasks", {})["result"]
    stream = httpx.post(sut.url, headers=sut.headers, timeout=30, json={
        "jsonrpc": "2.0", "id": "s1", "method": "SendStreamingMessage", "params": _text()})
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    # the card's ETag (HTTP caching, ::test_rest_specific_features)
    card_url = f"{sut.url}.well-known/agent-card.json"
    first = httpx.get(card_url, headers=sut.headers, timeout=10)
    if "etag" in first.headers:
        again = httpx.get(card_url, headers={**sut.headers, "If-None-Match": first.headers["etag"]}, timeout=10)
        assert again.status_code == 304


@pytest.mark.skip(reason="TCK protocol/test_a2a_v030_new_methods.py::test_grpc_specific_features: the server "
                         "offers no gRPC binding (the card names JSON-RPC and HTTP+JSON only)")
def test_tck_grpc_specific_features():
    """Not applicable (see the skip reason)."""


def test_tck_extended_agent_card_method_exists(sut):
    # TCK protocol/test_a2a_v030_new_methods.py::test_extended_agent_card_method_exists: the card
    # says extendedAgentCard true, and the method answers the card (not -32601)
    assert sut.card()["capabilities"]["extendedAgentCard"] is True
    assert sut.rpc("GetExtendedAgentCard", {})["result"]["name"] == "Helper"


# -- tests/mandatory/transport -------------------------------------------------------------------


def test_tck_multi_transport_equivalence(sut):
    # TCK transport/test_multi_transport_equivalence.py::test_message_sending_equivalence
    by_binding = {binding: sut.send(binding, "equivalence") for binding in (JSONRPC, REST)}
    assert {t["status"]["state"] for t in by_binding.values()} == {"TASK_STATE_COMPLETED"}
    assert set(by_binding[JSONRPC]) == set(by_binding[REST])
    # TCK transport/test_multi_transport_equivalence.py::test_task_retrieval_equivalence
    task_id = by_binding[JSONRPC]["id"]
    assert sut.call(JSONRPC, "GetTask", {"id": task_id})["result"] == sut.call(REST, "GetTask", {"id": task_id})[
        "result"]
    # TCK transport/test_multi_transport_equivalence.py::test_agent_card_access_equivalence: one
    # card for both bindings, naming both at the same agent
    urls = {i["protocolBinding"]: i["url"] for i in sut.card()["supportedInterfaces"] if i["protocolVersion"] == "1.0"}
    assert urls == {JSONRPC: sut.url, REST: f"{sut.url}rest"}
    # TCK transport/test_multi_transport_equivalence.py::test_error_handling_equivalence
    for method, params in (("GetTask", {"id": "nonexistent-task-id"}), ("CancelTask", {"id": "nonexistent-task-id"}),
                           ("SendMessage", {"message": {"kind": "message"}})):
        codes = {binding: sut.call(binding, method, params)["error"]["code"] for binding in (JSONRPC, REST)}
        assert codes[JSONRPC] == codes[REST], (method, codes)
    # TCK transport/test_multi_transport_equivalence.py::test_performance_equivalence: both answer
    # a GetTask well within the TCK's bound (its threshold: 5 s per operation)
    for binding in (JSONRPC, REST):
        start = time.monotonic()
        sut.call(binding, "GetTask", {"id": task_id})
        assert time.monotonic() - start < 5


def test_tck_concurrent_operation_equivalence(sut):
    # TCK transport/test_multi_transport_equivalence.py::test_concurrent_operation_equivalence:
    # concurrent sends over both bindings each make their own completed task
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        tasks = list(pool.map(lambda b: sut.send(b, "concurrent"), [JSONRPC, REST, JSONRPC, REST]))
    assert len({t["id"] for t in tasks}) == 4
    assert {t["status"]["state"] for t in tasks} == {"TASK_STATE_COMPLETED"}


# -- tests/mandatory/authentication and security -------------------------------------------------


@BINDINGS
def test_tck_authentication_enforced(binding, sut, live_server_url):
    # TCK authentication/test_auth_enforcement.py::test_authentication_required_when_declared,
    # ::test_invalid_credentials_rejected; authentication/test_auth_compliance_v030.py::
    # test_authentication_transport_consistency (both bindings), ::test_security_error_response_compliance
    # (401 with a challenge) — its ::test_security_scheme_structure_compliance is in
    # test_tck_agent_card, and ::test_oauth2_metadata_url_validation, ::test_mutual_tls_scheme_declaration
    # apply to schemes this card does not declare (the TCK skips them);
    # security/test_in_task_authentication.py::test_authentication_challenge_headers,
    # ::test_invalid_authentication_handling
    body = _text()
    for headers in ({}, {"Authorization": "Bearer not-a-real-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}):
        if binding == JSONRPC:
            response = httpx.post(sut.url, headers={"A2A-Version": "1.0", **headers}, timeout=10,
                                  json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": body})
        else:
            response = httpx.post(f"{sut.url}rest/message:send", headers={"A2A-Version": "1.0", **headers},
                                  json=body, timeout=10)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    # the card itself needs the token too, unless the agent is public
    assert httpx.get(f"{sut.url}.well-known/agent-card.json", timeout=10).status_code == 401


@pytest.mark.skip(reason="TCK security/test_in_task_authentication.py::test_auth_required_state_support, "
                         "::test_in_task_authentication_workflow, ::test_auth_state_transitions: no agent of "
                         "ours asks for credentials inside a task (TASK_STATE_AUTH_REQUIRED is never used); "
                         "the TCK skips them likewise for an SUT that does not")
def test_tck_in_task_authentication():
    """Not applicable (see the skip reason)."""


@pytest.mark.skip(reason="TCK security/test_transport_security.py, security/test_tls_configuration_enhanced.py, "
                         "security/test_certificate_validation.py: TLS versions, ciphers, certificates and HSTS "
                         "are the reverse proxy's in front of the platform (docs/deployment); the test server "
                         "is plain HTTP on 127.0.0.1, which the TCK treats as a development SUT and skips")
def test_tck_transport_security():
    """Not applicable (see the skip reason)."""


SENSITIVE_PATTERNS = [  # TCK security/test_agent_card_security.py::test_sensitive_information_protection
    r"(?i)(api[_-]?key|secret|token|password|credential)",
    r"(?i)(private[_-]?key|secret[_-]?key)",
    r"(?i)(access[_-]?token|bearer[_-]?token)",
    r"(?i)(client[_-]?secret|app[_-]?secret)",
    r"(?i)(127\.0\.0\.1|192\.168\.|10\.|172\.1[6-9]\.|172\.2[0-9]\.|172\.3[01]\.)",
    r"(?i)(internal|private|admin|debug|test).*(?:url|endpoint|host)",
    r"(?i)(database|db)[_-]?(url|host|connection)",
    r"(?i)(redis|mongo|sql)[_-]?(url|host|connection)",
]


def test_tck_agent_card_security(world, live_server_url):
    import re

    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Helper",
                     description="Answers questions.", a2a_public=True)
    # as a deployment serves it (the TCK allows localhost; 127.0.0.1 is on its list of internal hosts)
    card_url = f"{live_server_url}/a2a/helper/.well-known/agent-card.json"
    host = {"Host": live_server_url.removeprefix("http://").replace("127.0.0.1", "localhost")}
    # TCK security/test_agent_card_security.py::test_public_agent_card_access_control: a public
    # card (the agent's a2a_public switch; without it the card is for the tenant's callers, see
    # test_tck_authentication_enforced) is served without authentication, with the public fields
    response = httpx.get(card_url, headers=host, timeout=10)
    assert response.status_code == 200, response.text
    card = response.json()
    for field in ("name", "description", "supportedInterfaces", "version", "capabilities", "defaultInputModes",
                  "defaultOutputModes", "skills"):
        assert field in card, field
    # TCK security/test_agent_card_security.py::test_sensitive_information_protection, over the
    # card but its securitySchemes: the TCK's first pattern flags the word "token" anywhere, and
    # the bearer scheme's bearerFormat/description ("API token") are there to say which token to
    # send (the scheme's shape is checked in test_tck_agent_card)
    described = {k: v for k, v in card.items() if k != "securitySchemes"}
    flagged = [m for pattern in SENSITIVE_PATTERNS for m in re.findall(pattern, str(described).lower())]
    assert flagged == [], flagged
    assert not {"adminUrl", "internalUrl", "debugEndpoint", "privateConfig", "secrets", "credentials"} & set(card)
    # TCK security/test_agent_card_security.py::test_security_scheme_consistency: as in
    # test_tck_agent_card (authentication/test_auth_enforcement.py::test_authentication_scheme_consistency)
    assert set(card["securitySchemes"]) == {"bearer"}


def test_tck_extended_agent_card(sut):
    # TCK protocol/test_extended_agent_card.py (the 0.3 card's supportsAuthenticatedExtendedCard;
    # its endpoint is the card's url + "/card"): ::test_extended_agent_card_endpoint_exists and
    # ::test_extended_agent_card_authentication_required: without credentials a 401 (not 404) with
    # WWW-Authenticate; ::test_extended_agent_card_invalid_authentication: a bad bearer token, 401
    from agents.models import AgentInstance

    bind_builtin(AgentInstance.all_tenants.get(slug="helper"), "test_echo")
    legacy = httpx.get(f"{sut.url}.well-known/agent-card.json", headers=sut.headers, timeout=10).json()
    assert legacy["supportsAuthenticatedExtendedCard"] is True
    extended_url = legacy["url"].rstrip("/") + "/card"
    anonymous = httpx.get(extended_url, timeout=10)
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert httpx.get(extended_url, headers={"Authorization": "Bearer invalid-extended-card-token-12345"},
                     timeout=10).status_code == 401
    # ::test_extended_agent_card_response_format, with credentials (the TCK skips it without):
    # the 1.0 HTTP+JSON endpoint answers a card with the required fields and more skills than the
    # public card's (here: its one tool)
    public = sut.card()
    extended = sut.call(REST, "GetExtendedAgentCard", {})["result"]
    for field in ("name", "description", "version", "capabilities", "defaultInputModes", "defaultOutputModes",
                  "skills", "supportedInterfaces"):
        assert field in extended, field
    assert len(extended["skills"]) > len(public["skills"])
    unauthenticated = httpx.get(f"{sut.url}rest/extendedAgentCard", headers={"A2A-Version": "1.0"}, timeout=10)
    assert unauthenticated.status_code == 401


# -- tests/mandatory/quality ---------------------------------------------------------------------


def _well_formed_error(answer: dict[str, Any], request_id: str) -> dict[str, Any]:
    """TCK quality/test_error_validation_enhanced.py::validate_json_rpc_error_structure: a
    JSON-RPC 2.0 error answer with the request's id, an integer code and a message."""
    assert answer.get("jsonrpc") == "2.0" and answer.get("id") == request_id and "result" not in answer, answer
    error = answer["error"]
    assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str) and error["message"], answer
    return error


def test_tck_error_validation_enhanced(sut):
    # TCK quality/test_error_validation_enhanced.py::test_invalid_method_error_validation
    error = _well_formed_error(sut.rpc("invalid/nonexistent/method", {}, request_id="e1"), "e1")
    assert error["code"] == -32601
    assert any(word in error["message"].lower() for word in ("method", "not found", "invalid", "unknown"))
    # TCK quality/test_error_validation_enhanced.py::test_invalid_params_error_validation (the
    # TCK's 0.3 method tasks/get, here GetTask: the TCK accepts -32602, -32600 or -32603, or
    # no error; none is a 500)
    for i, params in enumerate(({}, {"id": 12345}, {"id": "test-task", "invalid_extra_param": "should_not_exist"})):
        answer = sut.rpc("GetTask", params, request_id=f"p{i}")
        error = _well_formed_error(answer, f"p{i}")
        assert error["code"] in (-32602, -32600, -32603, -32001), (params, answer)
    # TCK quality/test_error_validation_enhanced.py::test_nonexistent_resource_error_validation
    # (the TCK only warns about an unhelpful message; the SDK's "Validation failed" for an empty
    # id names the field in its data)
    error = _well_formed_error(sut.rpc("GetTask", {"id": "definitely-nonexistent-task-id-12345"}, request_id="n0"),
                               "n0")
    assert error["code"] == -32001 and "not found" in error["message"].lower(), error
    error = _well_formed_error(sut.rpc("GetTask", {"id": ""}, request_id="n1"), "n1")
    assert error["code"] == -32602 and '"id"' in json.dumps(error.get("data")), error
    # TCK quality/test_error_validation_enhanced.py::test_error_consistency_across_methods: the
    # same condition is the same code whatever the method (tasks/status and tasks/delete do not
    # exist in A2A: -32601, as every unknown method)
    missing = {m: _well_formed_error(sut.rpc(m, {"id": ""}, request_id=f"c-{m}"), f"c-{m}")["code"]
               for m in ("GetTask", "CancelTask", "SubscribeToTask")}
    assert len(set(missing.values())) == 1, missing
    unknown = {m: sut.rpc(m, {}, request_id="u")["error"]["code"] for m in ("tasks/status", "tasks/delete")}
    assert set(unknown.values()) == {-32601}, unknown
    # TCK quality/test_error_validation_enhanced.py::test_error_response_completeness: every
    # error above is complete (jsonrpc, id, code, message); so is a parse error's (id null)
    parse = sut.raw("{not json").json()
    assert parse["jsonrpc"] == "2.0" and parse["id"] is None and parse["error"]["code"] == -32700
    assert parse["error"]["message"]
