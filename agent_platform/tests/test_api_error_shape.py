"""The API's error contract (issue 23, M3 and L5): deeply nested JSON, oversize bodies and
unmatched /api/ URLs answer 4xx in the ``{message, extra}`` shape, never a 500 or an HTML page."""

from __future__ import annotations

import httpx
import pytest
from rest_framework.test import APIClient

from agent_platform.api_parsers import MAX_JSON_DEPTH, JSONDepthError, json_loads_bounded

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

DEEP = "[" * 20_000 + "]" * 20_000
"""The attack: JSON nested 20,000 deep (RecursionError in Python's parser)."""


def _deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _assert_error_shape(response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"message", "extra"} and isinstance(body["message"], str) and isinstance(body["extra"], dict)
    return body


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/auth/login/", "/api/v1/browser/pairings/"])
def test_anonymous_deep_json_is_a_400_not_a_500(path):
    client = APIClient(raise_request_exception=False)
    response = client.generic("POST", path, DEEP, content_type="application/json")
    body = _assert_error_shape(response, 400)
    assert body["message"].startswith("JSON parse error")


@pytest.mark.django_db
def test_member_deep_json_under_the_recursion_limit_is_refused_too(world):
    """900 levels parse in Python, then break whatever walks them: refused past 64."""
    client = world.client()
    client.raise_request_exception = False
    response = client.generic("POST", "/api/v1/tokens/", _deep_object(900), content_type="application/json")
    _assert_error_shape(response, 400)
    ok = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert ok.status_code == 201


def test_json_loads_bounded_counts_depth():
    assert json_loads_bounded(_deep_object(MAX_JSON_DEPTH - 1)) is not None
    assert json_loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(JSONDepthError):
        json_loads_bounded("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(JSONDepthError):
        json_loads_bounded(DEEP)
    with pytest.raises(JSONDepthError):
        json_loads_bounded('{"a": NaN}')
    assert json_loads_bounded('[1, {"b": [2, "x"]}]') == [1, {"b": [2, "x"]}]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/sessions/-1/", "/api/v1/runs/-5/cancel/", "/api/v1/no-such-thing/",
                                  "/api/v1/documents/abc/"])
def test_unmatched_api_urls_are_json_404s(world, path):
    client = world.client()
    client.raise_request_exception = False
    body = _assert_error_shape(client.get(path), 404)
    assert body == {"message": "Not found.", "extra": {}}


@pytest.mark.django_db
def test_console_and_spa_404s_stay_html(world):
    response = APIClient().get("/admin/no-such-page-here/")
    assert not response["Content-Type"].startswith("application/json")


def test_oversize_body_is_a_json_413_on_the_live_server(world, live_server_url):
    """2.5 MB + 1 byte to the running ASGI app, authenticated and anonymous."""
    from django.conf import settings

    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1
    payload = b'{"name": "' + b"x" * size + b'"}'
    for headers in ({"Authorization": f"Bearer {world.member_token}"}, {}):
        response = httpx.post(f"{live_server_url}/api/v1/tokens/" if headers else f"{live_server_url}/api/v1/auth/login/",
                              content=payload, headers={**headers, "Content-Type": "application/json"}, timeout=30)
        assert response.status_code == 413, response.text[:300]
        assert response.json() == {"message": "Request body too large.",
                                   "extra": {"max_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}}


def test_deep_json_on_the_live_server_is_a_400(world, live_server_url):
    for path, headers in (("/api/v1/auth/login/", {}),
                          ("/api/v1/tokens/", {"Authorization": f"Bearer {world.member_token}"})):
        response = httpx.post(f"{live_server_url}{path}", content=DEEP.encode(),
                              headers={**headers, "Content-Type": "application/json"}, timeout=30)
        assert response.status_code == 400, response.text[:300]
        assert set(response.json()) == {"message", "extra"}


@pytest.mark.django_db
def test_an_unhandled_exception_under_api_is_a_json_500(world, monkeypatch):
    from tenants.api import views

    def crash(self, request):
        raise RuntimeError("boom")

    monkeypatch.setattr(views.AuthMeApi, "get", crash)
    client = world.client()
    client.raise_request_exception = False
    from tenants.audit import current_audit_context
    from tenants.scoping import current_scope

    scope_before = current_scope()
    body = _assert_error_shape(client.get("/api/v1/auth/me/"), 500)
    assert body == {"message": "Internal server error.", "extra": {}}
    # the crashed view left neither its tenant scope nor its audit context behind
    assert current_scope() == scope_before and current_audit_context() is None


def _pool_timeout():
    """What Django raises when the connection pool has nothing free within its timeout: an
    OperationalError caused by psycopg_pool's PoolTimeout (through ``wrap_database_errors``)."""
    import psycopg_pool
    from django.db import connection

    with connection.wrap_database_errors:
        raise psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec")


@pytest.mark.django_db
def test_an_exhausted_database_pool_is_a_503_with_retry_after(world, monkeypatch):
    """A burst bigger than the process's pool: the request is fine, the server is busy. A 503
    the client may send again (DRF views, and plain views under /api/ such as the SSE stream),
    not a 500; other errors stay 500s."""
    from django.db import OperationalError

    from sessions import sse
    from tenants.api import views

    def busy(self, request):
        _pool_timeout()

    with pytest.raises(OperationalError):
        _pool_timeout()
    monkeypatch.setattr(views.AuthMeApi, "get", busy)
    client = world.client()
    client.raise_request_exception = False
    response = client.get("/api/v1/auth/me/")
    body = _assert_error_shape(response, 503)
    assert response["Retry-After"] == "5" and body["extra"] == {"retry_after_seconds": 5}
    assert "busy" in body["message"]

    async def authorize_busy(request, session_id):
        _pool_timeout()

    monkeypatch.setattr(sse, "_authorize", authorize_busy)
    response = client.get("/api/v1/sessions/1/events", HTTP_ACCEPT="text/event-stream")
    _assert_error_shape(response, 503)
    assert response["Retry-After"] == "5"

    def other_database_error(self, request):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(views.AuthMeApi, "get", other_database_error)
    _assert_error_shape(client.get("/api/v1/auth/me/"), 500)
