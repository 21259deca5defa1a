"""Bad input on the three doors never gets a 5xx or a hang (issue 36): property-based requests
(hypothesis) against the live ASGI server for the OpenAI-compatible API (``/api/openai/v1``), the
agents' MCP server (``/mcp/agents/``) and an agent's A2A server (``/a2a/<slug>/``, both the JSON-RPC
and the HTTP+JSON binding).

Each request is a valid one with one to three of its fields (nested ones too) replaced by any
JSON value (wrong types, huge numbers, deep or empty containers), removed, or joined by an
unknown field; or any JSON; or bytes that are not JSON; sent with a few content types and the
door's own headers set to odd values. The answer must come within :data:`TIME_BOUND_SECONDS`
(streams too: read to their end), must not be a 5xx, and a 4xx must be in the door's own error
shape: OpenAI's ``{"error": {"message", "type", "code", "param"}}``; for MCP and A2A the
protocol's JSON-RPC error or the platform's ``{"message", "extra"}`` (their HTTP edge: 401, 413,
429); for A2A's HTTP+JSON binding its ``{"error": {"code", "status", "message"}}``. A request
that happens to be valid runs the agent on the fake model (a worker answers it), so it is
answered too.

The examples are few and fixed (``derandomize``) so the module takes well under a minute on a
small machine; raise :data:`EXAMPLES` (and drop ``derandomize``) locally to search harder.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.tests.factories import agent_with_route
from llm.testing import Reply

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("all_tenants_scope"),
    pytest.mark.timeout(300),
]

TIME_BOUND_SECONDS = 15.0
"""Longest a door may take to answer one request (a valid one runs the agent on the fake model)."""
EXAMPLES = 30
"""Generated requests per test."""

_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))

# -- strategies --

_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
            | st.sampled_from(["", "helper", "0", "-1", "99999999999999999999", "\x00", "ROLE_USER", "user"]))
JSON_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=10)
"""Any JSON value, small."""
DEEP = b'{"a": ' * 3000 + b"1" + b"}" * 3000
"""JSON nested deeper than Python's parser goes (a RecursionError, not a ValueError)."""
NOT_JSON = st.binary(max_size=64) | st.sampled_from([
    b"", b"{", b"[1,", b"NaN", b'{"a": Infinity}', b"1e999999", b'"\\ud800"', b"[" * 5000 + b"]" * 5000,
    b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"x" * 10000 + b'"}', b"\xff\xfe{}",
])
"""Bodies that are not JSON (or JSON Python's parser would take but the standard does not)."""
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip)
"""Printable ASCII a header value may hold (the HTTP client refuses surrounding blanks)."""
CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", "",
                                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                 "application/json; charset=latin-1"])


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into ``value``'s dicts and lists (the root ``()`` first)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _at(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


@st.composite
def mutants(draw: st.DrawFn, base: Any) -> Any:
    """``base`` with one to three changes: a value replaced by any JSON value, a key or item
    removed, or an unknown key added to an object."""
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(list(_paths(body))))
        if not path:
            body = draw(JSON_VALUES) if draw(st.booleans()) else body
            continue
        parent, last = _at(body, path[:-1]), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "replace":
            parent[last] = draw(JSON_VALUES)
        elif action == "remove":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(JSON_VALUES)
    return body


def bodies(*valid: Any) -> st.SearchStrategy[bytes]:
    """Mostly one of ``valid`` mutated; also any JSON, and bytes that are not JSON."""
    as_json = st.one_of(*[mutants(base) for base in valid]) | JSON_VALUES
    encoded = as_json.map(lambda value: json.dumps(value).encode())
    return st.one_of(encoded, encoded, NOT_JSON)


PATH_IDS = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#%"),
                   min_size=1, max_size=30) | st.sampled_from(["0", "-1", "99999999999999999999", "resp_1", "resp_1_2",
                                                              "resp_0", "resp_x", "1@1", "helper@99999999999"])
"""Ids in a URL path: numbers out of range, prefixes, junk."""

# -- calling and checking --


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes
    seconds: float

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            pytest.fail(f"not JSON: {self.status} {self.headers.get('content-type')} {self.body[:300]!r}")


@dataclass
class Door:
    """The live server and a member's token of the tenant that has the agent ``helper``."""

    base: str
    token: str

    def call(self, method: str, path: str, *, body: bytes | None = None, content_type: str = "application/json",
             headers: dict[str, str] | None = None) -> Answer:
        """One request, read to its end (a stream too), failing the test past :data:`TIME_BOUND_SECONDS`."""
        sent = {**({"Authorization": f"Bearer {self.token}"} if self.token else {}),
                **({"Content-Type": content_type} if content_type else {}), **(headers or {})}
        started = time.monotonic()
        chunks: list[bytes] = []
        with httpx.Client(timeout=TIME_BOUND_SECONDS) as http, http.stream(
                method, f"{self.base}{path}", content=body, headers=sent) as response:
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() - started > TIME_BOUND_SECONDS:
                    pytest.fail(f"{method} {path} streamed past {TIME_BOUND_SECONDS} s: {b''.join(chunks)[-300:]!r}")
        seconds = time.monotonic() - started
        assert seconds <= TIME_BOUND_SECONDS, f"{method} {path} took {seconds:.1f} s"
        answer = Answer(response.status_code, response.headers, b"".join(chunks), seconds)
        assert answer.status < 500, f"{method} {path} {body!r:.300} → {answer.status} {answer.body[:500]!r}"
        return answer


@pytest.fixture
def door(world, fake_llm, celery_worker, live_server_url) -> Door:
    agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Helper")
    fake_llm.respond(lambda body: Reply("Fine."))
    return Door(live_server_url, world.member_token)


def _sse_data(body: bytes) -> list[Any]:
    """The JSON of each ``data:`` line of an SSE body (lines that are not JSON, e.g. ``[DONE]``, left out)."""
    found = []
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            try:
                found.append(json.loads(line[5:]))
            except ValueError:
                continue
    return found


def _is_platform_error(data: Any) -> bool:
    return isinstance(data, dict) and set(data) == {"message", "extra"} and isinstance(data["message"], str)


def _is_jsonrpc_error(data: Any) -> bool:
    return (isinstance(data, dict) and data.get("jsonrpc") == "2.0" and isinstance(data.get("error"), dict)
            and isinstance(data["error"].get("code"), int) and isinstance(data["error"].get("message"), str))


def assert_openai_shape(answer: Answer) -> None:
    if answer.status < 400:
        return
    error = answer.json().get("error")
    assert isinstance(error, dict) and set(error) == {"message", "type", "code", "param"}, answer.body[:300]
    assert isinstance(error["message"], str) and error["message"]


def assert_jsonrpc_shape(answer: Answer) -> None:
    """A 4xx is a JSON-RPC error or the platform's edge refusal; a 200 carries JSON-RPC messages."""
    if answer.status == 202 or answer.status == 204:
        return
    if answer.status >= 400:
        data = answer.json()
        assert _is_jsonrpc_error(data) or _is_platform_error(data), answer.body[:300]
        return
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        messages = _sse_data(answer.body)
    else:
        data = answer.json()
        messages = data if isinstance(data, list) else [data]
    assert messages and all(isinstance(m, dict) and m.get("jsonrpc") == "2.0" for m in messages), answer.body[:300]


def assert_a2a_rest_shape(answer: Answer) -> None:
    if answer.status < 400:
        return
    data = answer.json()
    error = data.get("error") if isinstance(data, dict) else None
    assert _is_platform_error(data) or (isinstance(error, dict) and isinstance(error.get("message"), str)
                                        and isinstance(error.get("code"), int)), answer.body[:300]


# -- the OpenAI-compatible API --

CHAT = {"model": "helper", "messages": [{"role": "user", "content": "hi"}]}
CHAT_VARIANTS = [
    CHAT,
    {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    {**CHAT, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
    {**CHAT, "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}], "tool_choice": "auto"},
    {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
    {**CHAT, "metadata": {"chat_id": "1"}},
]
RESPONSES = [
    {"model": "helper", "input": "hi"},
    {"model": "helper", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
     "instructions": "Be brief.", "stream": True},
    {"model": "helper", "input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
     "previous_response_id": "resp_1"},
    {"model": "helper", "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
     "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
]


@_SETTINGS
@given(body=bodies(*CHAT_VARIANTS), content_type=CONTENT_TYPES, chat_id=st.none() | HEADER_TEXT)
@example(body=DEEP, content_type="application/json", chat_id=None)
@example(body=json.dumps({**CHAT, "messages": [{"role": {}, "content": "x"}, *CHAT["messages"]]}).encode(),
         content_type="application/json", chat_id=None)
@example(body=json.dumps({**CHAT, "messages": [{"role": "user", "content": "hi"}] * 2000}).encode(),
         content_type="application/json", chat_id=None)
def test_chat_completions_answer_bad_input_in_openais_shape(door, body, content_type, chat_id):
    answer = door.call("POST", "/api/openai/v1/chat/completions", body=body, content_type=content_type,
                       headers={"X-Chat-Id": chat_id} if chat_id is not None else None)
    assert_openai_shape(answer)


@_SETTINGS
@given(body=bodies(*RESPONSES), content_type=CONTENT_TYPES)
@example(body=DEEP, content_type="application/json")
@example(body=json.dumps({**RESPONSES[1], "input": [{"role": [], "content": "hi"}]}).encode(),
         content_type="application/json")
def test_responses_answer_bad_input_in_openais_shape(door, body, content_type):
    assert_openai_shape(door.call("POST", "/api/openai/v1/responses", body=body, content_type=content_type))


@_SETTINGS
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
       path=st.sampled_from(["models", "models/{id}", "responses/{id}", "responses/{id}/cancel", "chat/completions",
                             "responses", "nope/{id}"]),
       object_id=PATH_IDS, query=st.none() | HEADER_TEXT, body=st.none() | bodies({}))
@example(method="GET", path="nope/{id}", object_id="1", query=None, body=None)
@example(method="DELETE", path="models", object_id="1", query=None, body=None)
def test_the_other_openai_paths_and_methods_answer_in_openais_shape(door, method, path, object_id, query, body):
    url = "/api/openai/v1/" + path.format(id=httpx.URL(f"/{object_id}").raw_path.decode().lstrip("/"))
    answer = door.call(method, url + (f"?{httpx.QueryParams({'q': query})}" if query else ""), body=body)
    assert_openai_shape(answer)


def test_a_bad_token_and_no_token_are_openais_401(door):
    for token in ("", "ap_nope", "Bearer x", "x" * 5000):
        answer = Door(door.base, token).call("GET", "/api/openai/v1/models")
        assert answer.status == 401 and answer.json()["error"]["code"] == "invalid_api_key", answer.body


# -- agents over MCP --

MCP_ACCEPT = "application/json, text/event-stream"
MCP_MESSAGES = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {"url": {}}},
        "clientInfo": {"name": "fuzz", "version": "1"}}},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "helper", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p1"}}},
    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "helper", "arguments": {"message": "hi", "chat_id": "1", "version": 1}}},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3, "reason": "x"}},
    {"jsonrpc": "2.0", "id": 5, "method": "ping"},
    [{"jsonrpc": "2.0", "id": 6, "method": "tools/list"}, {"jsonrpc": "2.0", "method": "notifications/initialized"}],
]


@_SETTINGS
@given(body=bodies(*MCP_MESSAGES), content_type=CONTENT_TYPES,
       version=st.sampled_from([None, "2025-11-25", "2026-07-28"]) | HEADER_TEXT,
       accept=st.sampled_from([MCP_ACCEPT, "application/json", "text/event-stream", "*/*", ""]),
       session_id=st.none() | HEADER_TEXT)
@example(body=json.dumps(MCP_MESSAGES[2]).encode(), content_type="application/json", version="2026-07-28",
         accept=MCP_ACCEPT, session_id=None)
@example(body=DEEP, content_type="application/json", version=None, accept=MCP_ACCEPT, session_id=None)
@example(body=json.dumps(MCP_MESSAGES[1]).encode(), content_type="text/plain", version=None, accept=MCP_ACCEPT,
         session_id=None)
def test_the_mcp_door_answers_bad_input_with_jsonrpc_errors(door, body, content_type, version, accept, session_id):
    headers = {"Accept": accept, **({"MCP-Protocol-Version": version} if version is not None else {}),
               **({"Mcp-Session-Id": session_id} if session_id is not None else {})}
    answer = door.call("POST", "/mcp/agents/", body=body, content_type=content_type, headers=headers)
    assert_jsonrpc_shape(answer)


# -- A2A --

A2A_MESSAGE = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
A2A_RPC = [
    {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": A2A_MESSAGE, "configuration": {"returnImmediately": True, "historyLength": 2}}},
    {"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage", "params": {"message": {
        **A2A_MESSAGE, "parts": [{"data": {"a": 1}}], "contextId": "1", "taskId": "1"}}},
    {"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "1", "historyLength": 5}},
    {"jsonrpc": "2.0", "id": 4, "method": "ListTasks", "params": {
        "contextId": "1", "status": "TASK_STATE_COMPLETED", "pageSize": 10, "pageToken": "x",
        "statusTimestampAfter": "2026-01-01T00:00:00Z", "includeArtifacts": True}},
    {"jsonrpc": "2.0", "id": 5, "method": "CancelTask", "params": {"id": "1"}},
    {"jsonrpc": "2.0", "id": 6, "method": "SubscribeToTask", "params": {"id": "1"}},
    {"jsonrpc": "2.0", "id": 7, "method": "CreateTaskPushNotificationConfig", "params": {
        "taskId": "1", "id": "c", "url": "https://hooks.example.com/a2a", "token": "t",
        "authentication": {"scheme": "Bearer", "credentials": "k"}}},
    {"jsonrpc": "2.0", "id": 8, "method": "GetTaskPushNotificationConfig", "params": {"taskId": "1", "id": "c"}},
    {"jsonrpc": "2.0", "id": 9, "method": "GetExtendedAgentCard", "params": {}},
    {"jsonrpc": "2.0", "id": 10, "method": "message/send", "params": {"message": {
        "kind": "message", "messageId": "m-2", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}}},
]


@_SETTINGS
@given(body=bodies(*A2A_RPC), content_type=CONTENT_TYPES,
       version=st.sampled_from([None, "1.0", "0.3", "2.0"]) | HEADER_TEXT,
       slug=st.sampled_from(["helper", "helper@1", "helper@99999999999", "nope", "HELPER", "helper@0"]))
@example(body=json.dumps(A2A_RPC[1]).encode(), content_type="application/json", version="1.0", slug="helper")
@example(body=DEEP, content_type="application/json", version="1.0", slug="helper")
@example(body=json.dumps({**A2A_RPC[3], "params": {"status": [[[1]]] * 3}}).encode(), content_type="application/json",
         version="1.0", slug="helper")
def test_the_a2a_jsonrpc_binding_answers_bad_input_with_its_errors(door, body, content_type, version, slug):
    answer = door.call("POST", f"/a2a/{slug}/", body=body, content_type=content_type,
                       headers={"A2A-Version": version} if version is not None else None)
    assert_jsonrpc_shape(answer)


A2A_REST_BODIES = [{"message": A2A_MESSAGE}, {"message": A2A_MESSAGE, "configuration": {"returnImmediately": True}},
                   {"url": "https://hooks.example.com/a2a", "token": "t"}, {}]


@_SETTINGS
@given(operation=st.sampled_from([
           ("POST", "message:send"), ("POST", "message:stream"), ("GET", "tasks/{id}"), ("GET", "tasks"),
           ("POST", "tasks/{id}:cancel"), ("GET", "tasks/{id}:subscribe"), ("POST", "tasks/{id}/pushNotificationConfigs"),
           ("GET", "tasks/{id}/pushNotificationConfigs"), ("GET", "tasks/{id}/pushNotificationConfigs/{id}"),
           ("DELETE", "tasks/{id}/pushNotificationConfigs/{id}"), ("GET", "extendedAgentCard"),
           ("POST", "v1/message:send"), ("GET", "v1/tasks/{id}"), ("PUT", "tasks/{id}"), ("POST", "nope"),
       ]),
       task_id=PATH_IDS, query=st.dictionaries(st.sampled_from(["pageSize", "status", "contextId", "historyLength",
                                                                "pageToken", "statusTimestampAfter", "x"]),
                                                HEADER_TEXT, max_size=3),
       body=bodies(*A2A_REST_BODIES), content_type=CONTENT_TYPES, version=st.sampled_from([None, "1.0", "0.3", "9"]))
@example(operation=("POST", "message:send"), task_id="1", query={}, body=DEEP, content_type="application/json",
         version="1.0")
def test_the_a2a_http_json_binding_answers_bad_input_with_its_errors(door, operation, task_id, query, body,
                                                                     content_type, version):
    method, path = operation
    quoted = httpx.URL(f"/{task_id}").raw_path.decode().lstrip("/")
    url = f"/a2a/helper/rest/{path.format(id=quoted)}" + (f"?{httpx.QueryParams(query)}" if query else "")
    answer = door.call(method, url, body=body if method in ("POST", "PUT") else None, content_type=content_type,
                       headers={"A2A-Version": version} if version is not None else None)
    assert_a2a_rest_shape(answer)
