"""Outbound webhook subscriptions: the tenant's events (:class:`~automations.models.EventType`)
POSTed to other systems, signed per Standard Webhooks with the ``standardwebhooks`` package
(``webhook-id`` = the delivery's ``message_id``, ``webhook-timestamp``, ``webhook-signature``).

Delivery is at least once: each event for each subscription is a :class:`WebhookDelivery` row
written with the event (on the event's commit its first attempt is queued); an attempt that
does not get a 2xx is retried after ``min(60 s · 2^(n-1), 6 h)`` times a random factor in
[0.5, 1.5) (exponential backoff with jitter), by the beat task ``automations.deliveries_due``
(every minute), until 24 hours after the event; then the delivery is ``failed``. A 410 Gone
disables the subscription (``disabled_reason``) and fails the delivery. Every attempt is a
:class:`DeliveryAttempt` row (the delivery log); ``redeliver`` queues one more attempt.

A2A push notifications (:mod:`sessions.api.a2a.push`) travel the same way: a run's end or pause
is one delivery per push-notification config of its task (:func:`task_push_emit`, event type
``a2a.task``), retried and logged as above; instead of the Standard Webhooks signature the
request authenticates as the A2A config says (``X-A2A-Notification-Token``, ``Authorization``).

Addresses: the URL is checked when saved (:func:`llm.netrules.check_outbound_url`) and at
every connect of every attempt (:func:`capabilities.a2a.http.checked_client`: the outbound
rules of ``capabilities.netsafe``, no redirects, no proxies from the environment).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import secrets
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from agent_platform.api_errors import ApplicationError
from automations.models import (
    A2A_PUSH_EVENT,
    DeliveryAttempt,
    DeliveryStatus,
    EventType,
    WebhookDelivery,
    WebhookSubscription,
)
from capabilities.a2a.http import checked_client
from capabilities.netsafe import FetchError, check_outbound_url
from tenants.crypto import secret_decrypt, secret_encrypt
from tenants.models import Tenant
from tenants.scoping import system_scope, tenant_scope

logger = logging.getLogger(__name__)

RETRY_FOR = timedelta(hours=24)
"""A delivery is retried until this long after its event, then ``failed``."""
BACKOFF_FIRST_SECONDS = 60.0
BACKOFF_MAX_SECONDS = 6 * 3600.0
TIMEOUT_SECONDS = 10.0
"""Per attempt: connect, write and read each."""
MAX_PAYLOAD_TEXT = 20_000
"""Long texts in an event (a run's reply or error) are cut to this many characters."""


def _secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _url_check(url: str) -> None:
    try:
        check_outbound_url(url)
    except FetchError as exc:
        raise ApplicationError(exc.message, extra={"fields": {"url": [exc.message]}}) from exc


def _event_types_check(event_types: Any) -> list[str]:
    known = set(EventType.values)
    if not isinstance(event_types, list) or not event_types or not all(isinstance(t, str) for t in event_types):
        raise ApplicationError(f"event_types must be a non-empty list of: {', '.join(sorted(known))}.")
    unknown = sorted(set(event_types) - known)
    if unknown:
        raise ApplicationError(f"Unknown event types {unknown}; known: {', '.join(sorted(known))}.")
    return sorted(set(event_types))


@transaction.atomic
def subscription_create(
    *, tenant: Tenant, url: str, event_types: list[str], description: str = ""
) -> tuple[WebhookSubscription, str]:
    """A new subscription and its secret (returned once; stored encrypted).

    Raises:
        ApplicationError: a URL the outbound rules refuse (loopback, private, metadata, not
            http(s)), or unknown event types.
    """
    _url_check(url)
    secret = _secret()
    subscription = WebhookSubscription(
        tenant=tenant,
        url=url,
        event_types=_event_types_check(event_types),
        description=description,
        secret_encrypted=secret_encrypt(tenant=tenant, plaintext=secret),
    )
    subscription.full_clean()
    subscription.save()
    _subscribes.pop(tenant.pk, None)
    return subscription, secret


@transaction.atomic
def subscription_update(*, subscription: WebhookSubscription, **fields: Any) -> WebhookSubscription:
    """Change ``url``, ``event_types``, ``description`` or ``is_active`` (re-activating clears
    ``disabled_reason``). Raises :class:`ApplicationError` as :func:`subscription_create`."""
    if "url" in fields:
        _url_check(fields["url"])
    if "event_types" in fields:
        fields["event_types"] = _event_types_check(fields["event_types"])
    for name, value in fields.items():
        setattr(subscription, name, value)
    if fields.get("is_active"):
        subscription.disabled_reason = ""
    subscription.full_clean()
    subscription.save()
    _subscribes.pop(subscription.tenant_id, None)
    return subscription


def _cut(data: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[:MAX_PAYLOAD_TEXT] if isinstance(v, str) else v) for k, v in data.items()}


_SUBSCRIBES_TTL_SECONDS = 10.0
_subscribes: dict[int, tuple[float, bool]] = {}


def _tenant_subscribes(tenant_id: int) -> bool:
    """Whether the tenant has an active subscription (cached per process for 10 s, dropped
    here when one is saved), so a run's end costs no query in a tenant without any."""
    cached = _subscribes.get(tenant_id)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    with tenant_scope(tenant_id):
        found = WebhookSubscription.objects.filter(is_active=True).exists()
    _subscribes[tenant_id] = (time.monotonic() + _SUBSCRIBES_TTL_SECONDS, found)
    return found


def tenant_subscribes_cached(tenant_id: int) -> bool | None:
    """What :func:`_tenant_subscribes` knows without a query: the cached answer while fresh,
    else None (unknown). No I/O: callable on an event loop."""
    cached = _subscribes.get(tenant_id)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    return None


def event_emit(*, tenant_id: int, event_type: str, data: dict[str, Any]) -> list[int]:
    """Write one delivery per active subscription of the tenant to ``event_type`` and queue
    their first attempts on commit. In the caller's transaction (if any) and any scope.

    Returns:
        The new deliveries' ids ([] when no subscription wants the event).
    """
    if not _tenant_subscribes(tenant_id):
        return []
    with tenant_scope(tenant_id):
        subscriptions = list(WebhookSubscription.objects.filter(is_active=True, event_types__contains=[event_type]))
        if not subscriptions:
            return []
        now = timezone.now()
        body = {"type": event_type, "timestamp": now.isoformat(), "data": _cut(data)}
        ids = []
        for subscription in subscriptions:
            delivery = WebhookDelivery.objects.create(
                tenant_id=tenant_id,
                subscription=subscription,
                event_type=event_type,
                message_id=f"msg_{uuid.uuid4().hex}",
                payload=body,
                next_attempt_at=now,
                retry_until=now + RETRY_FOR,
            )
            ids.append(delivery.pk)
    transaction.on_commit(lambda: _enqueue(ids, tenant_id))
    return ids


def task_push_emit(*, tenant_id: int, run_id: int) -> list[int]:
    """Write one ``a2a.task`` delivery per A2A push-notification config of run ``run_id``
    (its body: the task as it stands now, :func:`sessions.api.a2a.push.push_targets`) and queue
    their first attempts on commit. In the caller's transaction (if any) and any scope; one
    query when the run has no config.

    Returns:
        The new deliveries' ids.
    """
    from sessions.api.a2a.push import push_targets

    with tenant_scope(tenant_id):
        targets = push_targets(run_id)
        if not targets:
            return []
        now = timezone.now()
        ids = [
            WebhookDelivery.objects.create(
                tenant_id=tenant_id,
                push_config=config,
                event_type=A2A_PUSH_EVENT,
                message_id=f"msg_{uuid.uuid4().hex}",
                payload=body,
                next_attempt_at=now,
                retry_until=now + RETRY_FOR,
            ).pk
            for config, body in targets
        ]
    transaction.on_commit(lambda: _enqueue(ids, tenant_id))
    return ids


def _enqueue(delivery_ids: list[int], tenant_id: int) -> None:
    from automations.tasks import delivery_attempt as task

    for delivery_id in delivery_ids:
        try:
            task.delay(delivery_id, tenant_id)
        except Exception:  # the broker is down: the beat's deliveries_due sends it later
            logger.warning("delivery %s not queued now; deliveries_due will send it", delivery_id, exc_info=True)


def backoff_seconds(attempts: int, *, rng: random.Random | None = None) -> float:
    """The wait after the ``attempts``-th failed attempt: ``min(60 · 2^(attempts-1), 6 h)``
    seconds times a factor drawn from [0.5, 1.5)."""
    base = min(BACKOFF_FIRST_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_MAX_SECONDS)
    return base * (0.5 + (rng or random).random())


async def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    async with checked_client(headers, TIMEOUT_SECONDS) as client:
        response = await client.post(url, content=body)
        return response.status_code


def _push_headers(delivery: WebhookDelivery, body: str) -> dict[str, str]:
    """An A2A push notification's authentication: the platform's signature over ``body`` (a JWT,
    :func:`sessions.api.a2a.signing.push_signature`, in ``X-A2A-Notification-Signature``, and as
    ``Authorization: Bearer <JWT>`` when the config sets no ``Authorization``), and as the config
    says: the token in ``X-A2A-Notification-Token`` (the a2a-sdk's header; also
    ``A2A-Notification-Token``, a2a-go's) and ``Authorization: <scheme> <credentials>``."""
    from sessions.api.a2a.signing import SIGNATURE_HEADER, push_signature

    config = delivery.push_config
    signature = push_signature(body.encode(), issuer=config.base_url, audience=config.url, task_id=str(config.run_id))
    headers = {SIGNATURE_HEADER: signature, "authorization": f"Bearer {signature}"}
    if config.token_encrypted:
        token = secret_decrypt(tenant=config.tenant, ciphertext=config.token_encrypted)
        headers["x-a2a-notification-token"] = headers["a2a-notification-token"] = token
    if config.auth_scheme and config.auth_credentials_encrypted:
        credentials = secret_decrypt(tenant=config.tenant, ciphertext=config.auth_credentials_encrypted)
        headers["authorization"] = f"{config.auth_scheme} {credentials}"
    return headers


def _request(delivery: WebhookDelivery, body: str) -> tuple[str, dict[str, str]]:
    """The URL and headers of one attempt: a subscription's signed per Standard Webhooks, an A2A
    push notification's with its config's authentication (:func:`_push_headers`)."""
    now = timezone.now()
    headers = {
        "content-type": "application/json",
        "user-agent": "AgentPlatform-webhooks/1",
        "webhook-id": delivery.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
    }
    if delivery.push_config_id is not None:
        return delivery.push_config.url, {**headers, **_push_headers(delivery, body)}
    subscription = delivery.subscription
    secret = secret_decrypt(tenant=subscription.tenant, ciphertext=subscription.secret_encrypted)
    headers["webhook-signature"] = Webhook(secret).sign(delivery.message_id, now, body)
    return subscription.url, headers


def _inactive(delivery: WebhookDelivery) -> str:
    """Why ``delivery`` may not be sent ("" when it may): its subscription is disabled, or its
    push-notification config was deleted."""
    if delivery.subscription_id is not None:
        return "" if delivery.subscription.is_active else "The subscription is disabled."
    return "" if delivery.push_config_id is not None else "The task's push-notification config was deleted."


def _send(delivery: WebhookDelivery) -> tuple[int | None, str]:
    """One POST of ``delivery``: ``(status code, "")`` or ``(None, error)``."""
    body = json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False)
    try:
        url, headers = _request(delivery, body)
        check_outbound_url(url)
        return asyncio.run(_post(url, body.encode(), headers)), ""
    except FetchError as exc:
        return None, exc.message
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__


def delivery_attempt(*, delivery_id: int, now: datetime | None = None) -> str | None:
    """Make one attempt of a pending, due delivery (row locked meanwhile, so a concurrent
    attempt skips it), log it and decide what follows. In the delivery's tenant scope.

    Returns:
        The delivery's status after the attempt, or None (not pending, not due, or locked).
    """
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("subscription", "subscription__tenant", "push_config", "push_config__tenant")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        now = now or timezone.now()
        if delivery is None or (delivery.next_attempt_at and delivery.next_attempt_at > now):
            return None
        started = time.monotonic()
        inactive = _inactive(delivery)
        if inactive:
            code, error = None, inactive
        else:
            code, error = _send(delivery)
        DeliveryAttempt.objects.create(
            tenant_id=delivery.tenant_id,
            delivery=delivery,
            status_code=code,
            error=error,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        _after_attempt(delivery, code, error, now)
        return delivery.status


def _after_attempt(delivery: WebhookDelivery, code: int | None, error: str, now: datetime) -> None:
    delivery.attempts += 1
    if code is not None and 200 <= code < 300:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at = DeliveryStatus.DELIVERED, now, None
    elif code == 410:
        delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        if delivery.push_config_id is not None:  # the receiver is gone: the task's config goes too
            from sessions.models import TaskPushConfig

            TaskPushConfig.objects.filter(pk=delivery.push_config_id).delete()
        WebhookSubscription.objects.filter(pk=delivery.subscription_id).update(
            is_active=False, disabled_reason=f"The endpoint answered 410 Gone on {now.isoformat()}."
        )
        _subscribes.pop(delivery.tenant_id, None)
    else:
        retry_at = now + timedelta(seconds=backoff_seconds(delivery.attempts))
        if retry_at > delivery.retry_until or _inactive(delivery):
            delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        else:
            delivery.next_attempt_at = retry_at
    delivery.save(update_fields=["attempts", "status", "delivered_at", "next_attempt_at"])
    if error:
        logger.info("webhook delivery %s attempt %s: %s", delivery.pk, delivery.attempts, error)


@transaction.atomic
def delivery_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """Queue one more attempt of ``delivery`` now (also a delivered or failed one; retries
    follow for 24 hours from now if it fails). Raises :class:`ApplicationError` when its
    subscription is disabled or its push-notification config was deleted."""
    inactive = _inactive(delivery)
    if inactive:
        raise ApplicationError(f"{inactive[:-1]}; it cannot be redelivered." if delivery.subscription_id is None
                               else "The subscription is disabled; enable it first.")
    now = timezone.now()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.PENDING, next_attempt_at=now, retry_until=now + RETRY_FOR
    )
    delivery.refresh_from_db()
    transaction.on_commit(lambda: _enqueue([delivery.pk], delivery.tenant_id))
    return delivery


def deliveries_due(*, now: datetime | None = None) -> int:
    """Attempt every pending delivery that is due (the beat task ``automations.deliveries_due``,
    every minute). Returns how many were attempted."""
    now = now or timezone.now()
    with system_scope():
        due = list(
            WebhookDelivery.objects.unscoped()  # tenant-bypass: the sender looks at every tenant's due rows
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at")
            .values_list("pk", "tenant_id")[:500]
        )
    done = 0
    for delivery_id, tenant_id in due:
        with tenant_scope(tenant_id):
            done += delivery_attempt(delivery_id=delivery_id, now=now) is not None
    return done
