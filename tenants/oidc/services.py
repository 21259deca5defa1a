"""Writes of a single sign-on login: the user, their identity link, their memberships.

:func:`oidc_login_sync` runs once per successful login through the provider, after the ID
token was verified, with the token's (and UserInfo's) claims:

- The account is found by its :class:`~tenants.models.OidcIdentity` (the token's ``iss`` and
  ``sub``), never by username or e-mail: a local account (an operator's, a password user's)
  is never signed in through the provider, whatever the provider says its e-mail is.
- A new identity whose claims match no rule gets no account at all (the "no access" page);
  one that matches gets a user (username from ``preferred_username``, else ``email``, else
  ``sub``, made unique with ``-2``, ``-3``, …) with no usable password.
- Memberships follow the rules at every login, in the tenants the rules name (the *managed*
  tenants): a matching rule creates the membership or sets its role (the highest role of the
  matching rules); no matching rule removes it. Memberships in tenants no rule names (an
  invitation's) are left alone. A tenant's last owner is never demoted or removed (the
  change is skipped and logged).
- ``is_staff`` (the console) follows the memberships: on while the user is an owner or admin
  of a tenant. An account that is a superuser is an operator's: the provider never signs it
  in (refused, nothing changed).

Each membership change is audited by :mod:`tenants.services` (``source`` from the callback's
audit context, ``auth``); a new account's identity is audited as ``create``.

The sessions that started through the provider are recorded (:func:`oidc_session_record`) so
that the provider's Back-Channel Logout can end them (:func:`oidc_sessions_end`).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from agent_platform.revocations import session_ended_publish
from tenants.audit import Action, audit_record
from tenants.models import ADMIN_ROLES, Membership, Tenant
from tenants.oidc.models import OidcIdentity, OidcSession
from tenants.oidc.rules import TenantRule, grants_for_claims, managed_tenants
from tenants.scoping import system_scope
from tenants.services import membership_create, membership_delete, membership_update_role

logger = logging.getLogger(__name__)

USERNAME_MAX = 150
"""Django's ``User.username`` length."""
_NOT_IN_USERNAME = re.compile(r"[^\w.@+-]")


class Refusal:
    """Why a verified login gets no session (the sign-in page says it)."""

    NO_ACCESS = "no_access"
    """The claims match no rule (of an existing tenant): no membership."""
    OPERATOR = "operator"
    """The linked account is a superuser's: operators sign in with their password."""
    INACTIVE = "inactive"
    """The linked account was deactivated by an operator."""


@dataclass(frozen=True)
class SsoLogin:
    """What :func:`oidc_login_sync` decided."""

    user: Any = None
    """The user to log in, or None (then ``refusal`` says why)."""
    refusal: str = ""
    """A :class:`Refusal` value, or "" with a user."""
    created: bool = False
    """True when this login made the account."""


def username_base(claims: Mapping[str, Any]) -> str:
    """The username a new account starts from: ``preferred_username``, ``email`` or ``sub``
    (the first non-empty string), with characters Django's usernames do not allow as ``_``,
    cut to leave room for a ``-<n>`` suffix."""
    for claim in ("preferred_username", "email", "sub"):
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            return _NOT_IN_USERNAME.sub("_", value.strip())[: USERNAME_MAX - 12]
    return "user"


def _free_username(base: str) -> str:
    """``base``, else ``base-2``, ``base-3``, … (the first no user has, in any letter case)."""
    User = get_user_model()
    for n in range(1, 100):
        candidate = base if n == 1 else f"{base}-{n}"
        if not User.objects.filter(username__iexact=candidate).exists():
            return candidate
    return f"{base}-{secrets.token_hex(4)}"


def _text_claim(claims: Mapping[str, Any], name: str, limit: int) -> str:
    value = claims.get(name)
    return value.strip()[:limit] if isinstance(value, str) else ""


def _user_create(claims: Mapping[str, Any]) -> AbstractBaseUser:
    User = get_user_model()
    user = User.objects.create_user(_free_username(username_base(claims)))  # no usable password
    _user_update(user, claims)
    return user


def _user_update(user: Any, claims: Mapping[str, Any]) -> None:
    """E-mail and names from the claims (when given; a value the user model rejects is skipped)."""
    email = _text_claim(claims, "email", 254)
    fields = {"email": email if "@" in email else "", "first_name": _text_claim(claims, "given_name", 150),
              "last_name": _text_claim(claims, "family_name", 150)}
    changed = [name for name, value in fields.items() if value and getattr(user, name, value) != value]
    for name in changed:
        setattr(user, name, fields[name])
    if changed:
        user.save(update_fields=changed)


def _membership_apply(user: Any, membership: Membership | None, tenant: Tenant, role: str | None) -> None:
    """Create, re-role or remove one membership (``role`` None: remove); a refused change (the
    tenant's last owner) is logged and skipped."""
    try:
        if membership is None and role is not None:
            membership_create(tenant=tenant, user=user, role=role, detail={"via": "oidc"})
        elif membership is not None and role is None:
            membership_delete(membership=membership)
        elif membership is not None and role is not None and membership.role != role:
            membership_update_role(membership=membership, role=role)
    except ApplicationError as exc:
        logger.warning("single sign-on: membership of %s in %s left as it is: %s", user.get_username(),
                       tenant.slug, exc.message)


def _memberships_sync(user: Any, grants: dict[str, str], rules: tuple[TenantRule, ...]) -> None:
    managed = managed_tenants(rules)
    # tenant-bypass: the rules name tenants by slug, across tenants (the caller holds the system scope).
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=managed)}
    for slug in sorted(set(grants) - set(tenants)):
        logger.warning("single sign-on: OIDC_TENANT_RULES name tenant %r, which does not exist", slug)
    held = {m.tenant.slug: m for m in Membership.all_tenants.select_related("tenant")
            .filter(user=user, tenant__slug__in=managed)}
    for slug, tenant in sorted(tenants.items()):
        _membership_apply(user, held.get(slug), tenant, grants.get(slug))


def _staff_sync(user: Any) -> bool:
    """``is_staff`` on while the user is an owner or admin somewhere; True if they have any membership."""
    roles = set(Membership.all_tenants.filter(user=user).values_list("role", flat=True))
    staff = bool(roles & set(ADMIN_ROLES))
    if user.is_staff != staff:
        user.is_staff = staff
        user.save(update_fields=["is_staff"])
    return bool(roles)


def _identity_create(issuer: str, subject: str, claims: Mapping[str, Any]) -> OidcIdentity:
    user = _user_create(claims)
    identity = OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    audit_record(action=Action.CREATE, obj=identity, detail={"via": "oidc", "username": user.get_username()})
    return identity


@transaction.atomic
def oidc_login_sync(*, issuer: str, claims: Mapping[str, Any], rules: tuple[TenantRule, ...]) -> SsoLogin:
    """Find or make the account of a verified login, and bring its memberships in line with the rules.

    Args:
        issuer: The provider's issuer (the verified ID token's ``iss``).
        claims: The verified ID token's claims, with the UserInfo response's (same ``sub``);
            ``sub`` must be a non-empty string.
        rules: The parsed ``OIDC_TENANT_RULES``.

    Returns:
        :class:`SsoLogin`: the user to log in, or no user and the :class:`Refusal`.

    Raises:
        ValueError: ``sub`` is missing or empty.

    Side effects (see the module's docstring): may create a user and their identity, create,
    re-role and delete memberships (audited), set ``is_staff`` and the identity's
    ``last_login_at``. Runs in the system scope (a user's memberships span tenants).
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise ValueError("the ID token has no sub")
    grants = grants_for_claims(claims, rules)
    # tenant-bypass: a login decides the user's tenants; it reads and writes their memberships in all of them.
    with system_scope():
        identity = (OidcIdentity.objects.select_for_update().select_related("user")
                    .filter(issuer=issuer, subject=subject).first())
        created = identity is None
        if identity is None:
            if not Tenant.objects.filter(slug__in=list(grants)).exists():
                return SsoLogin(refusal=Refusal.NO_ACCESS)  # no account for someone with no access
            identity = _identity_create(issuer, subject, claims)
        user = identity.user
        if user.is_superuser:
            return SsoLogin(refusal=Refusal.OPERATOR)
        if not user.is_active:
            return SsoLogin(refusal=Refusal.INACTIVE)
        if not created:
            _user_update(user, claims)
        _memberships_sync(user, grants, rules)
        has_membership = _staff_sync(user)
        identity.last_login_at = timezone.now()
        identity.save(update_fields=["last_login_at"])
    if not has_membership:
        return SsoLogin(refusal=Refusal.NO_ACCESS)
    return SsoLogin(user=user, created=created)


def oidc_session_record(*, user: AbstractBaseUser, session_key: str, sid: str) -> OidcSession | None:
    """Record that login session ``session_key`` of ``user`` started through the provider.

    Args:
        user: The user just signed in (linked to the provider by an :class:`OidcIdentity`).
        session_key: The Django session's key after the login (the cookie's value).
        sid: The verified ID token's ``sid`` claim, "" when the provider sent none.

    Returns:
        The record (made, or updated when the same session signed in again), or None for a
        user without an identity link (nothing to record). Records of the same identity older
        than ``SESSION_COOKIE_AGE`` are deleted on the way (their sessions have expired).
    """
    from django.conf import settings

    identity = OidcIdentity.objects.filter(user=user).first()
    if identity is None:
        return None
    cutoff = timezone.now() - timedelta(seconds=settings.SESSION_COOKIE_AGE)
    OidcSession.objects.filter(identity=identity, created_at__lt=cutoff).delete()
    record, _ = OidcSession.objects.update_or_create(session_key=session_key,
                                                     defaults={"identity": identity, "sid": sid[:255]})
    return record


def oidc_session_forget(*, session_key: str) -> None:
    """Drop the record of ``session_key`` (the session signed out; nothing to end any more)."""
    OidcSession.objects.filter(session_key=session_key).delete()


def oidc_session_signed_out(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """``user_logged_out``: forget the record of the session signing out (before its flush)."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        oidc_session_forget(session_key=session_key)


def oidc_sessions_end(*, issuer: str, subject: str | None, sid: str | None) -> int:
    """End this platform's sessions that a Back-Channel Logout token names (OpenID Connect
    Back-Channel Logout 1.0, §2.4 and §2.7).

    Args:
        issuer: The token's verified ``iss``.
        subject: Its ``sub``, or None: with ``sid`` None, every session of that end user.
        sid: Its ``sid``, or None: with it, only the sessions that started in that session of
            the provider (and, when ``subject`` is given too, of that end user).
            At least one of ``subject`` and ``sid`` is given.

    Returns:
        How many sessions were ended (0 when none is open: already signed out, or expired).

    Side effects: deletes the sessions from the session store (the user is signed out at their
    next request) and their records, and announces each end once committed
    (:func:`agent_platform.revocations.session_ended_publish`: the event streams on those
    sessions' cookies close at once). The user's API tokens are not sessions and stay.

    Raises:
        ValueError: neither ``subject`` nor ``sid``.
    """
    from importlib import import_module

    from django.conf import settings

    if not subject and not sid:
        raise ValueError("a logout token names a sub or a sid")
    records = OidcSession.objects.filter(identity__issuer=issuer)
    if subject:
        records = records.filter(identity__subject=subject)
    if sid:
        records = records.filter(sid=sid)
    keys = list(records.values_list("session_key", flat=True))
    store = import_module(settings.SESSION_ENGINE).SessionStore
    for key in keys:
        store().delete(key)
    OidcSession.objects.filter(session_key__in=keys).delete()

    def announce() -> None:
        for key in keys:
            session_ended_publish(session_key=key)

    transaction.on_commit(announce)
    return len(keys)
