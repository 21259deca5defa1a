"""Writes for tenants, memberships, invitations and API tokens.

Each write that matters for security (memberships, invitations, tokens) appends an audit event
(:func:`tenants.audit.audit_record`) in the same transaction; the actor and the client address
come from the audit context of the request (API views, console), or are passed.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import status

from agent_platform.api_errors import ApplicationError, NotFound
from agent_platform.revocations import token_revoked_publish
from tenants.audit import Action, audit_record
from tenants.crypto import data_key_new_wrapped
from tenants.models import ApiToken, Invitation, Membership, Role, Tenant
from tenants.scoping import system_scope, tenant_scope

TOKEN_PREFIX = "ap_"
INVITATION_PREFIX = "inv_"


def token_hash(raw: str) -> str:
    """SHA-256 hex digest of a raw token (what is stored and looked up)."""
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def tenant_create(*, name: str, slug: str) -> Tenant:
    """Create a tenant with a fresh wrapped data key."""
    tenant = Tenant(name=name, slug=slug, wrapped_data_key=data_key_new_wrapped())
    tenant.full_clean()
    tenant.save()
    return tenant


TENANT_SETTINGS_FIELDS = ("record_llm_bodies", "llm_body_retention_days")
"""The tenant's own settings its admins change (the console's tenant page, ``admin/tenant/``);
the rest (name, slug, budget, run limit, trace content) are the operator's."""


@transaction.atomic
def tenant_settings_update(*, tenant: Tenant, **changes: Any) -> Tenant:
    """Change a tenant's own settings (:data:`TENANT_SETTINGS_FIELDS`: whether its model calls'
    bodies are kept, and for how many days); audited (``update``, with each change).

    Turning ``record_llm_bodies`` off stops recording at the next run; what was kept is deleted
    by the next hourly purge (:func:`sessions.llm_bodies.llm_bodies_purge`).

    Raises:
        ApplicationError: 400 for an unknown field or a value out of range (the model's
            validators: ``llm_body_retention_days`` 1–90), with ``extra.fields``.

    Requires the tenant's scope (or system scope).
    """
    unknown = sorted(set(changes) - set(TENANT_SETTINGS_FIELDS))
    if unknown:
        raise ApplicationError("Only these tenant settings can be changed here: "
                               f"{', '.join(TENANT_SETTINGS_FIELDS)}.",
                               extra={"fields": {name: ["Not a setting of this endpoint."] for name in unknown}})
    before = {name: getattr(tenant, name) for name in TENANT_SETTINGS_FIELDS}
    for name, value in changes.items():
        setattr(tenant, name, value)
    try:
        tenant.full_clean(exclude=["wrapped_data_key", "name", "slug"])
    except DjangoValidationError as exc:
        raise ApplicationError("Invalid tenant settings.", extra={"fields": exc.message_dict}) from None
    changed = {name: {"from": before[name], "to": getattr(tenant, name)} for name in TENANT_SETTINGS_FIELDS
               if before[name] != getattr(tenant, name)}
    if changed:
        tenant.save(update_fields=list(changed))
        audit_record(action=Action.UPDATE, obj=tenant, changes=changed)
    return tenant


@transaction.atomic
def membership_create(*, tenant: Tenant, user: AbstractBaseUser, role: str = Role.MEMBER,
                      detail: dict[str, Any] | None = None) -> Membership:
    """Make ``user`` a member of ``tenant`` with ``role``; audited (``create``).

    Raises:
        django.core.exceptions.ValidationError: already a member, or an unknown role.
    """
    membership = Membership(tenant=tenant, user=user, role=role)
    membership.full_clean()
    membership.save()
    audit_record(action=Action.CREATE, obj=membership, detail=detail,
                 changes={"user": {"to": f"{user.pk} {user.get_username()}"}, "role": {"to": role}})
    return membership


def _require_owner_for(*, membership: Membership, role: str | None, actor_role: str | None) -> None:
    """Only owners (or the system: ``actor_role`` None) make, change or remove owners; a tenant
    keeps at least one owner once it has one."""
    touches_owner = membership.role == Role.OWNER or role == Role.OWNER
    if touches_owner and actor_role is not None and actor_role != Role.OWNER:
        raise ApplicationError("Only owners may make, change or remove owners.", status_code=status.HTTP_403_FORBIDDEN)
    if membership.role == Role.OWNER and role != Role.OWNER:
        # tenant-bypass: the tenant's own owners (the caller holds its scope or the system's)
        owners = Membership.all_tenants.filter(tenant_id=membership.tenant_id, role=Role.OWNER).exclude(pk=membership.pk)
        if not owners.exists():
            raise ApplicationError("A tenant keeps at least one owner.", status_code=status.HTTP_409_CONFLICT)


@transaction.atomic
def membership_update_role(*, membership: Membership, role: str, actor_role: str | None = None) -> Membership:
    """Change a membership's role (its user and tenant never change); audited (``update``).

    Args:
        actor_role: The acting user's role in the tenant (None: a superuser or the system).

    Raises:
        ApplicationError: 400 an unknown role; 403 an admin touching an owner; 409 the last
            owner would go.
    """
    if role not in Role.values:
        raise ApplicationError(f"Unknown role {role!r}.", extra={"roles": list(Role.values)})
    _require_owner_for(membership=membership, role=role, actor_role=actor_role)
    old = membership.role
    membership.role = role
    membership.full_clean()
    membership.save(update_fields=["role"])
    if old != role:
        audit_record(action=Action.UPDATE, obj=membership, changes={"role": {"from": old, "to": role}})
    return membership


@transaction.atomic
def membership_delete(*, membership: Membership, actor_role: str | None = None) -> None:
    """Remove a user from a tenant (their tokens of that tenant go with it); audited.

    Raises:
        ApplicationError: 403 an admin removing an owner; 409 the last owner.
    """
    _require_owner_for(membership=membership, role=None, actor_role=actor_role)
    audit_record(action=Action.DELETE, obj=membership)
    membership.delete()


def membership_select(*, membership: Membership) -> None:
    """Remember that the user picked ``membership``'s tenant: it becomes their default
    (:func:`tenants.selectors.membership_for_user`). One UPDATE, only when another of the
    user's memberships was picked more recently (or this one never was)."""
    # tenant-bypass: the user's own memberships, across their tenants.
    with system_scope():
        newer = Membership.all_tenants.filter(user_id=membership.user_id).exclude(pk=membership.pk)
        if membership.last_selected_at is not None:
            newer = newer.filter(last_selected_at__gte=membership.last_selected_at)
        else:
            newer = None
        if newer is None or newer.exists():
            now = timezone.now()
            Membership.all_tenants.filter(pk=membership.pk).update(last_selected_at=now)
            membership.last_selected_at = now


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str
    """The token itself: shown once, never stored."""


@transaction.atomic
def api_token_create(*, membership: Membership, name: str = "") -> IssuedToken:
    """Issue a bearer token for ``membership``.

    Returns:
        The row and the raw token ``ap_<43 urlsafe chars>`` (256 bits of randomness); only
        its SHA-256 is stored.
    """
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.all_tenants.create(
        tenant_id=membership.tenant_id,
        membership=membership,
        name=name,
        prefix=raw[:10],
        token_hash=token_hash(raw),
    )
    audit_record(action=Action.TOKEN_ISSUED, obj=token,
                 detail={"membership_id": membership.pk, "user_id": membership.user_id, "name": name[:100]})
    return IssuedToken(token=token, raw=raw)


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token; it is refused from the next request on. Idempotent (audited once)."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(action=Action.TOKEN_REVOKED, obj=token,
                     detail={"membership_id": token.membership_id, "name": token.name})
        # Streams opened with the token close at once (agent_platform/revocations.py).
        token_id = token.pk
        transaction.on_commit(lambda: token_revoked_publish(token_id=token_id))
    return token


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    raw: str
    """The invitation token ``inv_…``: shown once to the inviting admin, never stored."""


def _invitation_ttl() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "INVITATION_TTL_SECONDS", 7 * 24 * 3600)))


@transaction.atomic
def invitation_create(*, tenant: Tenant, created_by: AbstractBaseUser | None, role: str = Role.MEMBER,
                      username: str = "", email: str = "", inviter_role: str | None = None) -> IssuedInvitation:
    """Invite one user (by ``username`` or ``email``) to join ``tenant`` with ``role``.

    Args:
        created_by: The inviting user (an owner/admin of ``tenant``; None for the system).
        inviter_role: The inviter's role in ``tenant`` (None: a superuser or the system).
            Only owners may invite owners.

    Returns:
        The row and the raw token ``inv_<43 urlsafe chars>`` (256 bits; only its SHA-256 is
        stored). Valid for ``INVITATION_TTL_SECONDS`` (default 7 days), once.

    Raises:
        ApplicationError: 400 neither username nor e-mail, or an unknown role; 403 an admin
            inviting an owner; 409 the named user is already a member.
    """
    username, email = (username or "").strip()[:150], (email or "").strip()[:254]
    if not username and not email:
        raise ApplicationError("Name the invited user by `username` or `email`.")
    if role not in Role.values:
        raise ApplicationError(f"Unknown role {role!r}.", extra={"roles": list(Role.values)})
    if role == Role.OWNER and inviter_role is not None and inviter_role != Role.OWNER:
        raise ApplicationError("Only owners may invite owners.", status_code=status.HTTP_403_FORBIDDEN)
    User = get_user_model()
    with system_scope():  # tenant-bypass: is the named user already one of this tenant's members?
        members = Membership.all_tenants.filter(tenant=tenant)
        if username and members.filter(**{f"user__{User.USERNAME_FIELD}": username}).exists():
            raise ApplicationError("This user is already a member.", status_code=status.HTTP_409_CONFLICT)
    raw = INVITATION_PREFIX + secrets.token_urlsafe(32)
    invitation = Invitation(
        tenant=tenant, username=username, email=email, role=role, token_hash=token_hash(raw), prefix=raw[:10],
        created_by=created_by if created_by is not None and created_by.is_authenticated else None,
        expires_at=timezone.now() + _invitation_ttl(),
    )
    invitation.full_clean(exclude=["token_hash", "prefix", "created_by"])
    invitation.save()
    audit_record(action=Action.INVITATION_CREATED, obj=invitation,
                 changes={"username": {"to": username}, "email": {"to": email}, "role": {"to": role}})
    return IssuedInvitation(invitation=invitation, raw=raw)


@transaction.atomic
def invitation_revoke(*, invitation: Invitation) -> Invitation:
    """Withdraw a pending invitation; idempotent (audited once).

    Raises:
        ApplicationError: 409 when it was already accepted.
    """
    if invitation.accepted_at is not None:
        raise ApplicationError("This invitation was already accepted.", status_code=status.HTTP_409_CONFLICT)
    if invitation.revoked_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_record(action=Action.INVITATION_REVOKED, obj=invitation)
    return invitation


def _invited(invitation: Invitation, user: AbstractBaseUser) -> bool:
    if invitation.username:
        return user.get_username() == invitation.username
    user_email = (getattr(user, "email", "") or "").strip()
    return bool(user_email) and user_email.lower() == invitation.email.lower()


@transaction.atomic
def invitation_accept(*, raw: str, user: AbstractBaseUser) -> Membership:
    """The invited, logged-in ``user`` accepts the invitation with token ``raw``: they become a
    member of its tenant with its role.

    Raises:
        NotFound: no pending invitation has this token (unknown, expired, revoked or used;
            one message for all).
        ApplicationError: 403 the invitation names another user; 409 already a member.
    """
    gone = NotFound("Invitation not found, expired or already used.")
    if not isinstance(raw, str) or not raw.startswith(INVITATION_PREFIX) or len(raw) > 200:
        raise gone
    # tenant-bypass: the invitation's token decides the tenant.
    with system_scope():
        invitation = (Invitation.all_tenants.select_for_update().select_related("tenant")
                      .filter(token_hash=token_hash(raw)).first())
    if invitation is None or invitation.state != "pending":
        raise gone
    if not _invited(invitation, user):
        raise ApplicationError("This invitation is for another user.", status_code=status.HTTP_403_FORBIDDEN)
    with tenant_scope(invitation.tenant_id):
        if Membership.objects.filter(user=user).exists():
            raise ApplicationError("You are already a member of this tenant.", status_code=status.HTTP_409_CONFLICT)
        try:
            with transaction.atomic():
                membership = membership_create(tenant=invitation.tenant, user=user, role=invitation.role,
                                               detail={"invitation_id": invitation.pk})
        except IntegrityError as exc:  # a concurrent accept of another invitation
            raise ApplicationError("You are already a member of this tenant.",
                                   status_code=status.HTTP_409_CONFLICT) from exc
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        audit_record(action=Action.INVITATION_ACCEPTED, obj=invitation, actor=user,
                     detail={"membership_id": membership.pk, "role": invitation.role})
    return membership
