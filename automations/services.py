"""Writes of the automations app: schedules (save, fire due slots) and webhook triggers (create,
rotate the secret, accept a signed request). docs/admin-guide.md, "Schedules and webhooks".

Exactly one run per slot: :func:`schedule_fire` inserts the slot's :class:`ScheduleSlot` row
(unique on schedule and slot time) before it starts the run, in the same transaction; a second
scheduler looking at the same slot waits on that row's unique index and then gets an
``IntegrityError``: it starts nothing. Missed slots (stated policy): a slot is on time while
at most :data:`ON_TIME_SECONDS` have passed since it; older slots were missed (the platform or
its beat was down). ``skip`` forgets them; ``run_once`` starts one run for all of them, at the
time of the first one missed, unless an on-time slot fires in the same pass (it stands for
them). A paused schedule has no missed slots: resuming starts from the next slot.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from automations.cron import CronInvalid, cron_check, last_slot_between, next_slots, zone_get
from automations.models import (
    ChatMode,
    EventType,
    InboundWebhook,
    MissedPolicy,
    Schedule,
    ScheduleSlot,
    SlotStatus,
    WebhookTrigger,
)
from automations.outbound import event_emit
from sessions.models import ChatSession, Run
from sessions.services import chat_session_create, message_post, run_purpose
from tenants.crypto import secret_encrypt
from tenants.models import Membership, Tenant
from tenants.scoping import system_scope, tenant_scope

logger = logging.getLogger(__name__)

ON_TIME_SECONDS = 300
"""A slot fires on time while at most this many seconds have passed since it (beat ticks each
minute, so a slow or restarted beat still catches it); older slots count as missed."""


# --- schedules ------------------------------------------------------------------------------


def schedule_next_slot(schedule: Schedule, *, after: datetime) -> datetime | None:
    """The first slot of ``schedule`` at or after ``after`` (UTC), None while paused."""
    if schedule.paused:
        return None
    found = next_slots(schedule.cron, zone_get(schedule.timezone), after, 1)
    return found[0] if found else None


def _chat_check(
    *, tenant: Tenant, agent: AgentInstance, owner: AbstractBaseUser, chat_mode: str, chat: ChatSession | None
) -> ChatSession | None:
    if chat_mode != ChatMode.FIXED:
        return None
    if chat is None:
        raise ApplicationError("A schedule with chat_mode 'fixed' needs a chat.")
    if chat.tenant_id != tenant.pk or chat.agent_id != agent.pk or chat.user_id != owner.pk or chat.deleted_at:
        raise ApplicationError("The chat must be one of the owner's chats with this agent.")
    return chat


@transaction.atomic
def schedule_save(
    *,
    tenant: Tenant,
    owner: AbstractBaseUser,
    agent: AgentInstance,
    cron: str,
    timezone_name: str = "UTC",
    message: str,
    name: str = "",
    chat_mode: str = ChatMode.NEW,
    chat: ChatSession | None = None,
    missed_policy: str = MissedPolicy.SKIP,
    paused: bool = False,
    schedule: Schedule | None = None,
) -> Schedule:
    """Create (``schedule`` None) or update a schedule; its next slot is computed from now (a
    change or a resume never fires slots that passed before it).

    Raises:
        ApplicationError: a bad cron expression or time zone, an empty message, an agent of
            another tenant or inactive, a fixed chat that is not the owner's with the agent.
    """
    try:
        cron = cron_check(cron)
        zone_get(timezone_name)
    except CronInvalid as exc:
        raise ApplicationError(str(exc)) from exc
    if not message.strip():
        raise ApplicationError("The message is empty.")
    if agent.tenant_id != tenant.pk or not agent.is_active:
        raise ApplicationError("No such active agent in this tenant.")
    chat = _chat_check(tenant=tenant, agent=agent, owner=owner, chat_mode=chat_mode, chat=chat)
    schedule = schedule or Schedule(tenant=tenant)
    schedule.owner, schedule.agent, schedule.cron, schedule.timezone = owner, agent, cron, timezone_name
    schedule.message, schedule.name, schedule.chat_mode, schedule.chat = message, name, chat_mode, chat
    schedule.missed_policy, schedule.paused = missed_policy, paused
    schedule.next_slot_at = schedule_next_slot(schedule, after=timezone.now())
    schedule.full_clean()
    schedule.save()
    return schedule


def schedule_upcoming(schedule: Schedule, *, count: int = 5, now: datetime | None = None) -> list[datetime]:
    """The next ``count`` slots (UTC) from ``now``; [] while paused or for a broken row."""
    if schedule.paused:
        return []
    try:
        return next_slots(schedule.cron, zone_get(schedule.timezone), now or timezone.now(), count)
    except CronInvalid:
        return []


def _plan(schedule: Schedule, now: datetime) -> tuple[datetime | None, bool]:
    """The slot to fire now and whether it is a catch-up (run_once for missed slots)."""
    zone = zone_get(schedule.timezone)
    due_from = schedule.next_slot_at
    on_time_start = max(due_from, now - timedelta(seconds=ON_TIME_SECONDS))
    on_time = last_slot_between(schedule.cron, zone, on_time_start, now)
    if on_time is not None:
        return on_time, False
    missed = due_from < now - timedelta(seconds=ON_TIME_SECONDS)
    if missed and schedule.missed_policy == MissedPolicy.RUN_ONCE:
        return due_from, True
    return None, False


def _owner_membership_ok(schedule: Schedule) -> bool:
    return Membership.objects.filter(user_id=schedule.owner_id, user__is_active=True).exists()


def _start_run(schedule: Schedule) -> Run:
    """Post the schedule's message as its owner (a new chat, or the fixed one)."""
    if not _owner_membership_ok(schedule):
        raise ApplicationError("The schedule's owner is no longer an active member of this tenant.")
    agent = AgentInstance.objects.filter(pk=schedule.agent_id).first()
    if agent is None or not agent.is_active:
        raise ApplicationError("The schedule's agent is not active.")
    owner = schedule.owner
    if schedule.chat_mode == ChatMode.FIXED:
        session = ChatSession.objects.filter(pk=schedule.chat_id, deleted_at__isnull=True).first()
        if session is None:
            raise ApplicationError("The schedule's chat no longer exists.")
    else:
        session = chat_session_create(user=owner, agent=agent, title=schedule.name)
    with run_purpose("schedule"):
        return message_post(session=session, user=owner, content=schedule.message)


def schedule_fire(*, schedule_id: int, now: datetime) -> ScheduleSlot | None:
    """Fire ``schedule_id``'s due slot, if one is due at ``now``, and move its next slot on.
    In the schedule's tenant scope.

    Returns:
        The slot row this call inserted (status ``started`` with the run, or ``failed`` with
        the reason), or None: nothing due, or another scheduler took the slot.
    """
    with transaction.atomic():
        schedule = Schedule.objects.select_related("owner").filter(pk=schedule_id).first()
        if schedule is None or schedule.paused or schedule.next_slot_at is None or schedule.next_slot_at > now:
            return None
        slot_time, catch_up = _plan(schedule, now)
        next_at = schedule_next_slot(schedule, after=now + timedelta(microseconds=1))
        Schedule.objects.filter(pk=schedule.pk, next_slot_at=schedule.next_slot_at).update(next_slot_at=next_at)
        if slot_time is None:
            return None
        try:
            with transaction.atomic():
                slot = ScheduleSlot.objects.create(
                    tenant_id=schedule.tenant_id, schedule=schedule, slot_time=slot_time, catch_up=catch_up
                )
        except IntegrityError:
            return None  # another scheduler took this slot
        try:
            with transaction.atomic():
                slot.run = _start_run(schedule)
        except ApplicationError as exc:
            slot.status, slot.error = SlotStatus.FAILED, exc.message
            event_emit(
                tenant_id=schedule.tenant_id,
                event_type=EventType.SCHEDULE_FAILED,
                data={"schedule_id": schedule.pk, "slot_time": slot_time.isoformat(), "error": exc.message},
            )
            logger.info("schedule %s slot %s not started: %s", schedule.pk, slot_time.isoformat(), exc.message)
        slot.save(update_fields=["run", "status", "error"])
        return slot


def schedules_tick(*, now: datetime | None = None) -> dict[str, int]:
    """Fire every schedule whose next slot is due (the beat task ``automations.schedules_tick``,
    every minute). Safe to run in several processes at once (see the module's docstring).

    Returns:
        ``{"due": schedules looked at, "started": runs started, "failed": slots whose start
        failed}``.
    """
    now = now or timezone.now()
    with system_scope():  # which tenants have due schedules: decided across tenants
        due = list(
            Schedule.objects.unscoped()  # tenant-bypass: the scheduler looks at every tenant's due schedules
            .filter(paused=False, next_slot_at__lte=now)
            .values_list("pk", "tenant_id")
        )
    counts = {"due": len(due), "started": 0, "failed": 0}
    for schedule_id, tenant_id in due:
        with tenant_scope(tenant_id):
            try:
                slot = schedule_fire(schedule_id=schedule_id, now=now)
            except Exception:
                logger.exception("schedule %s could not fire", schedule_id)
                continue
        if slot is not None:
            counts["started" if slot.status == SlotStatus.STARTED else "failed"] += 1
    return counts


# --- webhook triggers -----------------------------------------------------------------------

SECRET_PREFIX = "whsec_"


def _new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@transaction.atomic
def trigger_create(
    *, tenant: Tenant, owner: AbstractBaseUser, agent: AgentInstance, name: str = "", template: str | None = None
) -> tuple[WebhookTrigger, str]:
    """A new trigger and its secret (returned once; stored encrypted with the tenant's key).

    Raises:
        ApplicationError: an agent of another tenant or inactive, a template with a bad field.
    """
    if agent.tenant_id != tenant.pk or not agent.is_active:
        raise ApplicationError("No such active agent in this tenant.")
    secret = _new_secret()
    trigger = WebhookTrigger(
        tenant=tenant,
        owner=owner,
        agent=agent,
        name=name,
        secret_encrypted=secret_encrypt(tenant=tenant, plaintext=secret),
    )
    if template is not None:
        template_check(template)
        trigger.template = template
    trigger.full_clean()
    trigger.save()
    return trigger, secret


@transaction.atomic
def trigger_rotate_secret(*, trigger: WebhookTrigger) -> str:
    """A new secret for ``trigger`` (the old one stops working); returned once."""
    secret = _new_secret()
    trigger.secret_encrypted = secret_encrypt(tenant=trigger.tenant, plaintext=secret)
    trigger.save(update_fields=["secret_encrypted"])
    return secret


_FIELD = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_PATH = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
MAX_RENDERED_CHARS = 20_000


class PayloadInvalid(ValueError):
    """A payload the trigger's template cannot be filled from (the message says why)."""


def template_check(template: str) -> None:
    """Raise :class:`ApplicationError` for a ``{{ … }}`` field that is not a dotted path of
    names and list indices (``{{ payload }}``, ``{{ issue.title }}``, ``{{ items.0.id }}``)."""
    for match in _FIELD.finditer(template):
        if not _PATH.match(match.group(1)):
            raise ApplicationError(f"Template field {{{{ {match.group(1)} }}}} is not a dotted path of names.")


def _lookup(payload: Any, path: str) -> Any:
    """The value at ``path`` in JSON data: dict keys and list indices only (no attributes)."""
    if path == "payload":
        return payload
    value = payload
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise PayloadInvalid(f"The payload has no field {path!r} (the trigger's template uses it).")
    return value


def template_render(template: str, payload: Any) -> str:
    """``template`` with each ``{{ path }}`` replaced by that JSON value of ``payload``
    (strings as they are, other values as JSON). Only dict keys and list indices are looked up:
    no attribute of any Python object is reachable.

    Raises:
        PayloadInvalid: a field the payload lacks, or a message over :data:`MAX_RENDERED_CHARS`.
    """

    def value_of(match: re.Match[str]) -> str:
        value = _lookup(payload, match.group(1))
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    text = _FIELD.sub(value_of, template)
    if len(text) > MAX_RENDERED_CHARS:
        raise PayloadInvalid(f"The message made from the payload is longer than {MAX_RENDERED_CHARS} characters.")
    return text


def inbound_webhook_accept(*, trigger: WebhookTrigger, webhook_id: str, payload: Any) -> tuple[InboundWebhook, bool]:
    """Start ``trigger``'s agent with the message made from ``payload``, once per
    ``webhook_id``. In the trigger's tenant scope; the request's signature already verified.

    Returns:
        ``(row, created)``: created False is a replay of ``webhook_id`` (no new run; the row
        names the first request's run and chat).

    Raises:
        PayloadInvalid: the template cannot be filled from the payload.
        ApplicationError: the run cannot start (inactive agent or owner, …).
    """
    message = template_render(trigger.template, payload)
    try:
        with transaction.atomic():
            row = InboundWebhook.objects.create(tenant_id=trigger.tenant_id, trigger=trigger, webhook_id=webhook_id)
            if not Membership.objects.filter(user_id=trigger.owner_id, user__is_active=True).exists():
                raise ApplicationError("The trigger's owner is no longer an active member of this tenant.")
            agent = AgentInstance.objects.filter(pk=trigger.agent_id, is_active=True).first()
            if agent is None:
                raise ApplicationError("The trigger's agent is not active.")
            session = chat_session_create(user=trigger.owner, agent=agent, title=trigger.name)
            with run_purpose("webhook"):
                run = message_post(session=session, user=trigger.owner, content=message)
            row.run, row.chat = run, session
            row.save(update_fields=["run", "chat"])
            return row, True
    except IntegrityError:
        existing = InboundWebhook.objects.filter(trigger=trigger, webhook_id=webhook_id).first()
        if existing is None:
            raise
        return existing, False
