"""Fixtures of the single sign-on tests: the provider started in the test, and the platform
configured against it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tenants.oidc.backchannel import jwks_forget
from tenants.oidc.provider import discovery_forget
from tenants.oidc.tests.oidc_provider import FakeOidcProvider

RULES = [
    {"claim": "groups", "value": "acme-users", "tenant": "acme", "role": "member"},
    {"claim": "groups", "value": "acme-admins", "tenant": "acme", "role": "admin"},
    {"claim": "realm_access.roles", "value": "acme-owners", "tenant": "acme", "role": "owner"},
    {"claim": "groups", "value": "initech-users", "tenant": "initech", "role": "member"},  # no such tenant
]


@pytest.fixture
def provider() -> Iterator[FakeOidcProvider]:
    server = FakeOidcProvider().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sso(settings, provider: FakeOidcProvider) -> FakeOidcProvider:
    """Single sign-on on, against ``provider``, with :data:`RULES`."""
    settings.OIDC_ENABLED = True
    settings.OIDC_PROVIDER_NAME = "Keycloak"
    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_RP_CLIENT_ID = provider.client_id
    settings.OIDC_RP_CLIENT_SECRET = provider.client_secret
    settings.OIDC_TENANT_RULES = json.dumps(RULES)
    settings.OIDC_TIMEOUT = 5.0
    discovery_forget()
    jwks_forget()
    yield provider
    discovery_forget()
    jwks_forget()
