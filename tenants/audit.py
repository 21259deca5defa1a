"""The audit log: one writer (:func:`audit_record`) and the hooks that call it.

What is recorded (README "Audit log"): every admin write, from the console (the admin
classes' ``log_addition`` / ``log_change`` / ``log_deletions``, :class:`AuditedModelAdminMixin`,
with a fallback on Django's own ``LogEntry`` for admin classes without the mixin) and from the
admin API (:class:`tenants.api.mixins.TenantScopedViewSet`'s create/update/destroy), and the
security events: failed logins and lockouts (signals, :func:`connect_signals`), API tokens
issued and revoked, membership and invitation changes, device pairing, approval decisions,
OAuth consents and grant revocations (the services that make them call :func:`audit_record`).

Who acted and from where comes from the *audit context* (a ContextVar set by the entry points:
the API base classes, the console's middleware) unless the caller passes it. Secret values
never reach a row: fields whose name says secret (:func:`is_secret_field`: API keys, ``env``,
``headers``, passwords, tokens, hashes, encrypted columns) are recorded as
``{"changed": true}`` only.

Rows are written in the system scope (:func:`tenants.scoping.system_scope`) because an event
may belong to no tenant (``tenant`` null: a failed login for an unknown username); row-level
security shows such rows to the system scope (superusers) only, and a tenant's rows to that
tenant's scope.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Iterable, Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db import models

from tenants.models import AuditEvent
from tenants.scoping import system_scope

logger = logging.getLogger(__name__)

MAX_VALUE_CHARS = 200
"""Recorded ``from``/``to`` values are cut to this many characters."""

_SECRET_NAMES = frozenset({"env", "headers", "password", "password1", "password2", "api_key", "token",
                           "code", "poll_secret", "wrapped_data_key", "secret", "secrets"})
_SECRET_PARTS = ("secret", "password", "api_key", "encrypted", "token", "_hash", "wrapped", "credential")


class Action:
    """The ``action`` values (stable names: filters and dashboards use them)."""

    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    LOGIN_FAILED = "login_failed"
    LOGIN_LOCKED_OUT = "login_locked_out"
    TOKEN_ISSUED = "token_issued"
    TOKEN_REVOKED = "token_revoked"
    MEMBERSHIP_CREATED = "membership_created"
    INVITATION_CREATED = "invitation_created"
    INVITATION_ACCEPTED = "invitation_accepted"
    INVITATION_REVOKED = "invitation_revoked"
    DEVICE_PAIRING_APPROVED = "device_pairing_approved"
    DEVICE_PAIRED = "device_paired"
    DEVICE_REVOKED = "device_revoked"
    APPROVAL_DECIDED = "approval_decided"
    TENANT_SELECTED = "tenant_selected"
    OAUTH_CONSENT_GIVEN = "oauth_consent_given"
    OAUTH_GRANT_REVOKED = "oauth_grant_revoked"


@dataclass(frozen=True)
class AuditContext:
    """Who is acting, through what: filled in by the entry points."""

    source: str
    """``api``, ``console``, ``auth`` or ``system``."""
    actor_id: int | None = None
    actor_repr: str = ""
    ip_address: str | None = None


_context: ContextVar[AuditContext | None] = ContextVar("audit_context", default=None)


def client_ip(request: Any) -> str | None:
    """The request's peer address (``REMOTE_ADDR``) if it is an IP address, else None.

    Forwarded-for headers are not trusted (they are the client's to write)."""
    raw = (getattr(request, "META", None) or {}).get("REMOTE_ADDR") or ""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


def context_for_request(request: Any, *, source: str, user: Any = None) -> AuditContext:
    """An :class:`AuditContext` for ``request`` (``user``, else ``request.user``, if
    authenticated, and the peer address)."""
    if user is None:
        user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return AuditContext(source=source, actor_id=user.pk, actor_repr=user.get_username()[:150],
                            ip_address=client_ip(request))
    return AuditContext(source=source, ip_address=client_ip(request))


def enter_audit_context(context: AuditContext) -> Token[AuditContext | None]:
    """Make ``context`` current until :func:`reset_audit_context` with the returned token."""
    return _context.set(context)


def reset_audit_context(token: Token[AuditContext | None]) -> None:
    """Undo the :func:`enter_audit_context` that returned ``token``."""
    _context.reset(token)


@contextlib.contextmanager
def audit_context(context: AuditContext) -> Iterator[None]:
    """The body runs with ``context`` as the audit context."""
    token = _context.set(context)
    try:
        yield
    finally:
        _context.reset(token)


def current_audit_context() -> AuditContext | None:
    """The audit context set by the entry point, or None (code outside a request)."""
    return _context.get()


def is_secret_field(name: str) -> bool:
    """True for a field whose value must never be recorded (only that it changed)."""
    lowered = name.lower()
    return lowered in _SECRET_NAMES or any(part in lowered for part in _SECRET_PARTS)


def _text(value: Any) -> Any:
    """A JSON-safe, bounded rendering of a field value."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, models.Model):
        value = f"{value._meta.label_lower}:{value.pk} {value}"
    elif isinstance(value, datetime | date | Decimal):
        value = value.isoformat() if not isinstance(value, Decimal) else str(value)
    elif isinstance(value, list | tuple | set | frozenset) and all(isinstance(v, models.Model) for v in value):
        value = ", ".join(f"{v._meta.label_lower}:{v.pk}" for v in value)
    text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def model_snapshot(obj: models.Model) -> dict[str, Any]:
    """``{attname: value}`` of ``obj``'s concrete fields (foreign keys as ids), as stored;
    timestamps Django keeps itself (``auto_now``) left out."""
    return {field.attname: getattr(obj, field.attname, None) for field in obj._meta.concrete_fields
            if not getattr(field, "auto_now", False)}


def snapshot_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """The fields that differ between two :func:`model_snapshot` results.

    Returns:
        ``{field: {"from": v, "to": v}}``; a new object (``before`` None) lists its set fields
        with ``to`` only; secret fields are ``{"changed": true}`` (values never recorded).
    """
    changes: dict[str, Any] = {}
    for name, new in after.items():
        old = None if before is None else before.get(name)
        if before is not None and old == new:
            continue
        if before is None and new in (None, "", [], {}):
            continue
        label = name[:-3] if name.endswith("_id") else name
        if is_secret_field(name):
            changes[label] = {"changed": True}
        elif before is None:
            changes[label] = {"to": _text(new)}
        else:
            changes[label] = {"from": _text(old), "to": _text(new)}
    return changes


def form_changes(form: Any) -> dict[str, Any]:
    """The changed fields of a console form (``form.changed_data``), values bounded and
    secrets (by name, or a password widget) recorded as ``{"changed": true}``."""
    from django import forms

    changes: dict[str, Any] = {}
    for name in getattr(form, "changed_data", []) or []:
        field = form.fields.get(name)
        secret = is_secret_field(name) or isinstance(getattr(field, "widget", None), forms.PasswordInput)
        if secret:
            changes[name] = {"changed": True}
            continue
        old = form.initial.get(name)
        new = getattr(form, "cleaned_data", {}).get(name)
        if isinstance(old, list) and old and not isinstance(old[0], models.Model):
            old = ", ".join(str(v) for v in old)
        changes[name] = {"from": _text(old), "to": _text(new)}
    return changes


def _tenant_id_of(obj: models.Model | None) -> int | None:
    if obj is None:
        return None
    from tenants.models import Tenant

    if isinstance(obj, Tenant):
        return obj.pk
    tenant_id = getattr(obj, "tenant_id", None)
    return tenant_id if isinstance(tenant_id, int) else None


def audit_record(
    *,
    action: str,
    obj: models.Model | None = None,
    tenant_id: int | None = None,
    object_type: str = "",
    object_id: Any = "",
    object_repr: str = "",
    changes: dict[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
    actor: Any = None,
    source: str | None = None,
    ip_address: str | None = None,
) -> AuditEvent:
    """Append one event to the audit log.

    Args:
        action: An :class:`Action` value.
        obj: The object acted on; gives ``object_type`` (``app_label.model``), ``object_id``,
            ``object_repr`` and, if tenant-owned (or a Tenant), the tenant.
        tenant_id: The event's tenant when ``obj`` does not give it; None: no tenant (visible
            to superusers only).
        changes: ``{field: {"from", "to"} | {"changed": true}}`` (see :func:`snapshot_changes`);
            the caller must not put secret values here.
        detail: Context of the event (JSON-safe, small).
        actor: The acting user (None: from the audit context; anonymous: no actor).
        source: ``api`` / ``console`` / ``auth`` / ``system`` (None: from the audit context,
            else ``system``).
        ip_address: The client's address (None: from the audit context).

    Returns:
        The stored :class:`~tenants.models.AuditEvent`.

    Side effects: one INSERT, in the caller's transaction (an event of a rolled-back change is
    rolled back with it), under the system scope.
    """
    context = _context.get()
    if actor is not None and getattr(actor, "is_authenticated", False):
        actor_id, actor_repr = actor.pk, actor.get_username()[:150]
    elif actor is None and context is not None:
        actor_id, actor_repr = context.actor_id, context.actor_repr
    else:
        actor_id, actor_repr = None, ""
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id if object_id not in ("", None) else obj.pk
        object_repr = object_repr or str(obj)
        if tenant_id is None:
            tenant_id = _tenant_id_of(obj)
    event = AuditEvent(
        tenant_id=tenant_id,
        action=action[:64],
        source=(source or (context.source if context else "system"))[:16],
        actor_id=actor_id,
        actor_repr=actor_repr,
        object_type=object_type[:100],
        object_id="" if object_id is None else str(object_id)[:64],
        object_repr=(object_repr or "")[:200],
        changes=changes or {},
        detail=detail or {},
        ip_address=ip_address or (context.ip_address if context else None),
    )
    # tenant-bypass: an event may name any tenant, or none; the writer is trusted code.
    with system_scope():
        event.save(force_insert=True)
    return event


# --- the console ------------------------------------------------------------------------------

_admin_logged: ContextVar[bool] = ContextVar("audit_admin_logged", default=False)


class AuditedModelAdminMixin:
    """Records every console add/change/delete of a ModelAdmin in the audit log.

    Django's admin calls ``log_addition`` / ``log_change`` after a save and ``log_deletions``
    before a delete (also for the bulk delete action); each writes one
    :class:`~tenants.models.AuditEvent` per object (``source="console"``) with the changed
    fields (``form_changes``), then Django's own ``LogEntry``.
    """

    def construct_change_message(self, request: Any, form: Any, formsets: Any, add: bool) -> Any:
        request._audit_form_changes = form_changes(form)
        return super().construct_change_message(request, form, formsets, add)  # type: ignore[misc]

    def _audit_console(self, request: Any, action: str, obj: models.Model, message: Any) -> None:
        detail: dict[str, Any] = {}
        if message:
            detail["message"] = message if isinstance(message, list | str) else str(message)
        context = context_for_request(request, source="console")
        audit_record(action=action, obj=obj, changes=getattr(request, "_audit_form_changes", None) or {},
                     detail=detail, actor=request.user, source="console", ip_address=context.ip_address)

    def _with_flag(self, call: Any) -> Any:
        token = _admin_logged.set(True)
        try:
            return call()
        finally:
            _admin_logged.reset(token)

    def log_addition(self, request: Any, obj: models.Model, message: Any) -> Any:
        self._audit_console(request, Action.CREATE, obj, message)
        return self._with_flag(lambda: super(AuditedModelAdminMixin, self).log_addition(request, obj, message))

    def log_change(self, request: Any, obj: models.Model, message: Any) -> Any:
        self._audit_console(request, Action.UPDATE, obj, message)
        return self._with_flag(lambda: super(AuditedModelAdminMixin, self).log_change(request, obj, message))

    def log_deletions(self, request: Any, queryset: Iterable[models.Model]) -> Any:
        objects = list(queryset)
        request._audit_form_changes = {}
        for obj in objects:
            self._audit_console(request, Action.DELETE, obj, "")
        return self._with_flag(lambda: super(AuditedModelAdminMixin, self).log_deletions(request, objects))


def _logentry_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    """Fallback for console admin classes without :class:`AuditedModelAdminMixin` (Django's
    user admin, superuser-only admins): one event per admin ``LogEntry`` written."""
    if not created or _admin_logged.get():
        return
    from django.contrib.admin.models import ADDITION, CHANGE

    action = {ADDITION: Action.CREATE, CHANGE: Action.UPDATE}.get(instance.action_flag, Action.DELETE)
    obj = None
    if action != Action.DELETE:
        with contextlib.suppress(Exception):  # the object may be gone or of an unknown type
            obj = instance.get_edited_object()
    try:
        message = instance.get_change_message()
    except Exception:  # noqa: BLE001 - a malformed message must not fail the admin write
        message = ""
    audit_record(
        action=action, obj=obj, object_type=instance.content_type.app_label + "." + instance.content_type.model
        if instance.content_type_id else "", object_id=instance.object_id or "",
        object_repr=instance.object_repr, actor=instance.user, source="console",
        detail={"message": message} if message else {},
    )


# --- login failures and lockouts ---------------------------------------------------------------


def _login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """``user_login_failed``: one event per tenant of the named user (none if unknown)."""
    from django.contrib.auth import get_user_model

    failures = _failures(request)
    if failures is not None and failures > _failure_limit():
        return  # an attempt while locked out: the lockout event stands for it (bounded rows per attacker)
    username = str(credentials.get(get_user_model().USERNAME_FIELD) or credentials.get("username") or "")[:150]
    _login_event(Action.LOGIN_FAILED, username=username, request=request)


def _locked_out(sender: Any, request: Any = None, username: str | None = None, ip_address: str | None = None,
                **kwargs: Any) -> None:
    """django-axes ``user_locked_out`` (sent at the failure that locks, and again for every
    attempt during the lockout: recorded once, at the one that locks)."""
    failures = _failures(request)
    if failures is not None and failures != _failure_limit():
        return
    _login_event(Action.LOGIN_LOCKED_OUT, username=str(username or "")[:150], request=request,
                 ip_address=ip_address)


def _failures(request: Any) -> int | None:
    """Failed attempts so far for this request's username + address (django-axes counts them
    in its own ``user_login_failed`` receiver, which runs before ours), or None."""
    value = getattr(request, "axes_failures_since_start", None)
    return value if isinstance(value, int) else None


def _failure_limit() -> int:
    from django.conf import settings

    return int(getattr(settings, "AXES_FAILURE_LIMIT", 10))


def _login_event(action: str, *, username: str, request: Any, ip_address: str | None = None) -> None:
    from django.contrib.auth import get_user_model

    from tenants.models import Membership

    User = get_user_model()
    ip = client_ip(request) if request is not None else None
    if ip is None and ip_address:
        with contextlib.suppress(ValueError):
            ip = str(ipaddress.ip_address(ip_address))
    path = str(getattr(request, "path", "") or "")[:200]
    detail = {"username": username, "path": path}
    with system_scope():  # tenant-bypass: which tenants know this user decides where the event goes
        user = User._default_manager.filter(**{User.USERNAME_FIELD: username}).first() if username else None
        tenant_ids = list(Membership.all_tenants.filter(user=user).values_list("tenant_id", flat=True)[:20]) \
            if user is not None else []
    for tenant_id in tenant_ids or [None]:
        audit_record(action=action, tenant_id=tenant_id, obj=user, object_repr=username if user is None else "",
                     object_type="" if user is not None else "auth.user", detail=detail, actor=None,
                     source="auth", ip_address=ip)


def connect_signals() -> None:
    """Connect the login-failure, lockout and admin ``LogEntry`` receivers (``TenantsConfig.ready``)."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.signals import user_login_failed
    from django.db.models.signals import post_save

    user_login_failed.connect(_login_failed, dispatch_uid="tenants.audit.login_failed")
    post_save.connect(_logentry_saved, sender=LogEntry, dispatch_uid="tenants.audit.logentry")
    try:
        from axes.signals import user_locked_out
    except ImportError:  # django-axes not installed
        return
    user_locked_out.connect(_locked_out, dispatch_uid="tenants.audit.locked_out")
