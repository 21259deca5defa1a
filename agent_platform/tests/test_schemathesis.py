"""A bounded schemathesis run against the app's own OpenAPI schema (issue 23, L5).

The schema is loaded from ``/api/schema/`` of the Django app and called through its WSGI
application (in process, the test database); every operation gets a handful of generated requests (:data:`MAX_EXAMPLES`,
valid and invalid input) as a tenant admin, and the non-admin operations also as a member. Each answer must not be a
5xx, must have a documented status code and content type, and its body must match the
schema (the ``Error`` component for errors). A few minutes at most in all.

Left out: operations that reach outside the platform (a route's ``test/`` calls the model
providers, an MCP server's ``test/`` starts or calls it) and ``logout``/token revocation,
which would end the run's own credentials half-way.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, settings
from schemathesis import checks
from schemathesis.config import SchemathesisConfig

MAX_EXAMPLES = 4
"""Generated requests per operation and role."""
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance]

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

_CONFIG = SchemathesisConfig.from_str("""
[[operations]]
include-path-regex = "[{]"
phases.coverage.enabled = false
""")
"""Schemathesis' coverage phase (boundary and invalid values of every field, in combinations:
~500 requests for an agent's body) only where the path has no parameter: the creates and the
lists. An operation on ``/{id}/`` is called with ids that name nothing (a 404 before the body
is read), so its coverage cases tested the 404 a thousand times; it keeps the fuzzing phase's
:data:`MAX_EXAMPLES`."""


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """As Django's test client does: requests must not close the database connection that
    holds the test's transaction (Django closes it around each request otherwise)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _load_schema() -> schemathesis.schemas.BaseSchema:
    """The schema ``/api/schema/`` serves (fetched through Django's test client when the
    module is collected: no database needed), called through the WSGI app."""
    response = Client().get("/api/schema/", {"format": "json"}, HTTP_HOST="localhost")
    assert response.status_code == 200, response.content[:300]
    loaded = schemathesis.openapi.from_dict(json.loads(response.content), config=_CONFIG)
    loaded.app = get_wsgi_application()
    return (loaded.include(path_regex=r"^/api/v1/")
            .exclude(path_regex=r"/test/$")
            .exclude(path_regex=r"/(logout|revoke)/$"))


schema = _load_schema()
member_schema = schema.exclude(path_regex=r"^/api/v1/admin/")  # a member gets 403 there: the admin run covers them
_SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))


@member_schema.parametrize()
@_SETTINGS
def test_the_api_answers_a_member_as_its_schema_says(case, world):
    case.call_and_validate(headers={"Authorization": f"Bearer {world.member_token}"}, checks=CHECKS)


@schema.parametrize()
@_SETTINGS
def test_the_api_answers_a_tenant_admin_as_its_schema_says(case, world):
    case.call_and_validate(headers={"Authorization": f"Bearer {world.admin_token}"}, checks=CHECKS)
