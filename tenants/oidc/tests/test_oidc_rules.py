"""The claim mapping rules (pure) and the start-up check of the single sign-on settings."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from tenants.oidc.provider import oidc_config_check, oidc_config_problems
from tenants.oidc.rules import RulesError, claim_values, grants_for_claims, managed_tenants, rules_parse
from tenants.oidc.services import username_base

RULES = rules_parse(json.dumps([
    {"claim": "groups", "value": "acme-users", "tenant": "acme", "role": "member"},
    {"claim": "groups", "value": "acme-admins", "tenant": "acme", "role": "admin"},
    {"claim": "realm_access.roles", "value": "globex-owner", "tenant": "globex", "role": "owner"},
    {"claim": "hd", "value": "initech.example", "tenant": "initech", "role": "member"},
    {"claim": "staff", "value": "true", "tenant": "initech", "role": "admin"},
]))


@pytest.mark.parametrize(("claims", "grants"), [
    ({"groups": ["acme-users"]}, {"acme": "member"}),
    ({"groups": ["acme-admins", "acme-users"]}, {"acme": "admin"}),  # the highest role, in any order
    ({"groups": "acme-admins"}, {"acme": "admin"}),  # a single string claim
    ({"realm_access": {"roles": ["globex-owner"]}}, {"globex": "owner"}),  # a dotted path
    ({"realm_access.roles": ["globex-owner"]}, {"globex": "owner"}),  # a claim named with a dot
    ({"hd": "initech.example", "staff": True}, {"initech": "admin"}),  # a boolean compared as JSON
    ({"groups": ["ACME-USERS", "acme-users-x"], "hd": ["initech.example.org"]}, {}),  # exact values only
    ({"groups": [{"acme-users": 1}, ["acme-users"]]}, {}),  # objects and nested lists are no values
    ({}, {}),
])
def test_grants_for_claims(claims, grants):
    assert grants_for_claims(claims, RULES) == grants


def test_managed_tenants_and_claim_values():
    assert managed_tenants(RULES) == {"acme", "globex", "initech"}
    assert claim_values({"a": {"b": [1, "x", None]}}, "a.b") == ["1", "x"]
    assert claim_values({"a": "x"}, "a.b") == []


@pytest.mark.parametrize(("raw", "message"), [
    ("[", "not JSON"),
    ('{"claim": "groups"}', "must be a JSON list"),
    ('["groups"]', "is not an object"),
    ('[{"claim": "groups", "value": "x", "tenant": "acme"}]', "missing: ['role']"),
    ('[{"claim": "groups", "value": "x", "tenant": "acme", "role": "admin", "extra": 1}]', "unknown: ['extra']"),
    ('[{"claim": "groups", "value": "x", "tenant": "acme", "role": "superuser"}]', "is not one of"),
    ('[{"claim": "groups", "value": "x", "tenant": "Acme Inc", "role": "member"}]', "is not a tenant slug"),
    ('[{"claim": "groups", "value": "", "tenant": "acme", "role": "member"}]', "non-empty string"),
    ('[{"claim": "groups", "value": 3, "tenant": "acme", "role": "member"}]', "non-empty string"),
])
def test_malformed_rules_are_refused_with_the_reason(raw, message):
    with pytest.raises(RulesError, match=message.replace("[", r"\[").replace("]", r"\]")):
        rules_parse(raw)


def test_the_settings_are_checked_at_start_up_only_when_on(settings):
    settings.OIDC_ENABLED = False
    settings.OIDC_TENANT_RULES = "not json"
    assert oidc_config_problems() == []
    settings.OIDC_ENABLED = True
    settings.OIDC_ISSUER = ""
    settings.OIDC_RP_CLIENT_ID = ""
    settings.OIDC_RP_SIGN_ALGO = "PS256"
    with pytest.raises(ImproperlyConfigured) as raised:
        oidc_config_check()
    for part in ("OIDC_ISSUER", "OIDC_CLIENT_ID is empty", "OIDC_SIGN_ALGO 'PS256'", "not JSON"):
        assert part in str(raised.value)
    settings.OIDC_ISSUER = "https://sso.example.com/realms/acme"
    settings.OIDC_RP_CLIENT_ID = "agent-platform"
    settings.OIDC_RP_SIGN_ALGO = "HS256"
    settings.OIDC_RP_CLIENT_SECRET = ""
    settings.OIDC_TENANT_RULES = "[]"
    assert oidc_config_problems() == ["OIDC_SIGN_ALGO HS256 needs OIDC_CLIENT_SECRET (the key of its signatures)",
                                      "OIDC_TENANT_RULES is empty: no one could sign in"]
    settings.OIDC_RP_SIGN_ALGO = "RS256"
    settings.OIDC_TENANT_RULES = [{"claim": "groups", "value": "x", "tenant": "acme", "role": "member"}]
    assert oidc_config_problems() == []


def test_a_new_accounts_username_comes_from_the_claims():
    assert username_base({"preferred_username": "ann lee", "email": "a@x.io", "sub": "1"}) == "ann_lee"
    assert username_base({"preferred_username": " ", "email": "a@x.io", "sub": "1"}) == "a@x.io"
    assert username_base({"sub": "4f/2"}) == "4f_2"
    assert len(username_base({"sub": "x" * 400})) == 138
