"""The operator's claim mapping rules: which tenants and roles an OpenID Connect login gives.

``OIDC_TENANT_RULES`` is a JSON list of rules, each an object with exactly these keys::

    {"claim": "groups", "value": "acme-admins", "tenant": "acme", "role": "admin"}

- ``claim``: the name of a claim of the ID token or the UserInfo response; a dotted path
  reaches into an object claim (Keycloak's ``realm_access.roles``). Names with a dot of their
  own are looked up as they are first.
- ``value``: the rule matches when the claim equals this string, or is a list holding it
  (``groups``, ``roles``). A claim holding a number or a boolean is compared as JSON text
  (``true``, ``42``).
- ``tenant``: a tenant's slug.
- ``role``: ``owner``, ``admin`` or ``member``.

Several rules naming one tenant: the highest role among those that match wins (owner > admin
> member). Pure functions: no database, no settings (the caller passes the parsed rules).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROLE_RANK = {"member": 0, "admin": 1, "owner": 2}
"""Roles from the least to the most privileged (:class:`tenants.models.Role` values)."""

_RULE_KEYS = frozenset({"claim", "value", "tenant", "role"})
_SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")


class RulesError(ValueError):
    """``OIDC_TENANT_RULES`` is not a list of valid rules; the message names the rule and why."""


@dataclass(frozen=True)
class TenantRule:
    """One mapping rule: members of ``value`` in ``claim`` get ``role`` in tenant ``tenant``."""

    claim: str
    """The claim's name, or a dotted path into an object claim."""
    value: str
    """The value the claim must equal or, for a list claim, contain."""
    tenant: str
    """The tenant's slug."""
    role: str
    """``owner``, ``admin`` or ``member``."""


def _rule_parse(index: int, item: Any) -> TenantRule:
    if not isinstance(item, dict):
        raise RulesError(f"OIDC_TENANT_RULES[{index}] is not an object")
    keys = set(item)
    if keys != _RULE_KEYS:
        missing, extra = sorted(_RULE_KEYS - keys), sorted(keys - _RULE_KEYS)
        raise RulesError(f"OIDC_TENANT_RULES[{index}] needs exactly claim, value, tenant and role"
                         f" (missing: {missing or 'none'}; unknown: {extra or 'none'})")
    for key in _RULE_KEYS:
        if not isinstance(item[key], str) or not item[key].strip():
            raise RulesError(f"OIDC_TENANT_RULES[{index}].{key} must be a non-empty string")
    if item["role"] not in ROLE_RANK:
        raise RulesError(f"OIDC_TENANT_RULES[{index}].role {item['role']!r} is not one of {sorted(ROLE_RANK)}")
    if not _SLUG.match(item["tenant"]):
        raise RulesError(f"OIDC_TENANT_RULES[{index}].tenant {item['tenant']!r} is not a tenant slug")
    return TenantRule(claim=item["claim"].strip(), value=item["value"], tenant=item["tenant"], role=item["role"])


def rules_parse(raw: str | list[Any]) -> tuple[TenantRule, ...]:
    """Parse ``OIDC_TENANT_RULES`` (its JSON text, or the decoded list).

    Returns:
        The rules, in order; empty for an empty text.

    Raises:
        RulesError: not JSON, not a list, or a rule without exactly the four keys, with an
            empty value, an unknown role or a tenant that is not a slug.
    """
    if isinstance(raw, str):
        if not raw.strip():
            return ()
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RulesError(f"OIDC_TENANT_RULES is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise RulesError("OIDC_TENANT_RULES must be a JSON list of rules")
    return tuple(_rule_parse(i, item) for i, item in enumerate(raw))


def claim_values(claims: Mapping[str, Any], path: str) -> list[str]:
    """The values of claim ``path`` in ``claims`` as strings (a list claim's items; absent: []).

    ``path`` is tried as a claim name first, then as a dotted path into object claims. Objects
    and nested lists inside the claim are not values (they never match a rule).
    """
    value: Any = claims.get(path) if path in claims else _dotted(claims, path)
    items = value if isinstance(value, list) else [value]
    return [_as_text(item) for item in items if item is not None and not isinstance(item, dict | list)]


def _dotted(claims: Mapping[str, Any], path: str) -> Any:
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _as_text(item: Any) -> str:
    return item if isinstance(item, str) else json.dumps(item)


def grants_for_claims(claims: Mapping[str, Any], rules: tuple[TenantRule, ...]) -> dict[str, str]:
    """The tenants and roles the rules give a user with ``claims``.

    Returns:
        ``{tenant slug: role}``, the highest matching role per tenant; empty when no rule
        matches.
    """
    grants: dict[str, str] = {}
    for rule in rules:
        if rule.value not in claim_values(claims, rule.claim):
            continue
        held = grants.get(rule.tenant)
        if held is None or ROLE_RANK[rule.role] > ROLE_RANK[held]:
            grants[rule.tenant] = rule.role
    return grants


def managed_tenants(rules: tuple[TenantRule, ...]) -> frozenset[str]:
    """The slugs of the tenants the rules name: an SSO user's memberships there follow the rules."""
    return frozenset(rule.tenant for rule in rules)
