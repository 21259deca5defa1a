"""Model call records (issue 40): the exact request and response bodies of a tenant's LLM calls.

A tenant that opts in (``Tenant.record_llm_bodies``, off by default) gets one
:class:`~sessions.models.LLMCallBody` row per ``LLMCall`` (one attempt): the JSON body sent to
the provider exactly as sent and the answer as JSON (a stream assembled by the adapter:
:class:`llm.records.BodyCapture`). Nothing else changes for a tenant that does not: its
router is built without capture (no body is built, kept or serialised) and its calls are
written by the same statements as before.

- :func:`body_columns`: the row's body columns for an attempt record, each body cut at
  ``LLM_BODY_MAX_BYTES`` bytes of UTF-8 (the cut marked); None when the record carries no body.
  The writers: the runner's turn save and failed attempts (``sessions.runs.records``: the body
  is a CTE of the same statement as its call, so one INSERT and no extra round trip) and the
  metered calls outside runs (``sessions.llm_calls``).
- :func:`llm_bodies_purge`: the hourly retention (beat ``sessions.llm_bodies_purge``): each
  tenant's bodies older than its ``llm_body_retention_days``, and every body of a tenant that
  turned recording off, whatever their age.

Bodies never hold a provider key: they are bodies, not headers (the key travels in the
``Authorization`` / ``x-api-key`` header), and the router replaces the entry's key should a
body contain it (:meth:`llm.records.BodyCapture.texts`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from llm.records import AttemptRecord
from sessions.models import LLMCallBody
from tenants.models import Tenant
from tenants.scoping import system_scope, tenant_scope

BODY_COLUMNS = ("request", "request_bytes", "request_truncated", "response", "response_bytes", "response_truncated")
"""The body columns of an :class:`~sessions.models.LLMCallBody` row besides its tenant, call and time."""

PURGE_BATCH = 5000
"""Bodies deleted per tenant and call, at most (the hourly beat catches up)."""


def body_max_bytes() -> int:
    """``LLM_BODY_MAX_BYTES``: the longest body kept, bytes of UTF-8 (at least 1,000)."""
    return max(1000, int(getattr(settings, "LLM_BODY_MAX_BYTES", 1_000_000)))


def body_cut(text: str, max_bytes: int) -> tuple[str, int, bool]:
    """``(kept text, size in bytes of UTF-8, whether it was cut)``: ``text`` cut at
    ``max_bytes`` bytes of UTF-8 (never inside a character). A character UTF-8 cannot encode (a
    lone surrogate) becomes ``?``, a NUL U+FFFD (PostgreSQL refuses it in ``text``)."""
    try:
        data = text.encode()
    except UnicodeEncodeError:
        data = text.encode("utf-8", "replace")
        text = data.decode()
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
        data = text.encode()
    if len(data) <= max_bytes:
        return text, len(data), False
    return data[:max_bytes].decode("utf-8", "ignore"), len(data), True


def body_columns(record: AttemptRecord, *, max_bytes: int | None = None) -> dict[str, Any] | None:
    """The :data:`BODY_COLUMNS` of ``record``'s body row, or None when it carries no request
    body (the tenant does not record bodies, or the attempt failed before its request was
    built: nothing to write).

    Args:
        record: An attempt of a router built with ``capture_bodies``.
        max_bytes: Cut each body there (default :func:`body_max_bytes`).

    Returns:
        ``{request, request_bytes, request_truncated, response, response_bytes,
        response_truncated}``; ``response`` is ``""`` when no answer came.
    """
    if record.bodies is None:
        return None
    request_text, response_text = record.bodies.texts()
    if request_text is None:
        return None
    limit = body_max_bytes() if max_bytes is None else max_bytes
    request, request_bytes, request_truncated = body_cut(request_text, limit)
    response, response_bytes, response_truncated = body_cut(response_text or "", limit)
    return {"request": request, "request_bytes": request_bytes, "request_truncated": request_truncated,
            "response": response, "response_bytes": response_bytes, "response_truncated": response_truncated}


def llm_bodies_purge(*, now: datetime | None = None) -> int:
    """Delete model call records past their tenant's retention (the beat task
    ``sessions.llm_bodies_purge``, hourly), each tenant's in its own scope: bodies older than
    ``Tenant.llm_body_retention_days`` days, and all of a tenant whose ``record_llm_bodies``
    is off (turning recording off deletes what was kept within the hour). At most
    :data:`PURGE_BATCH` per tenant and call.

    Returns:
        The bodies deleted.
    """
    now = now or timezone.now()
    # tenant-bypass: the purge finds which tenants have bodies, then deletes each tenant's in its scope.
    with system_scope():
        tenant_ids = set(LLMCallBody.objects.unscoped().values_list("tenant_id", flat=True).distinct())
        policies = dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "record_llm_bodies"))
        days = dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "llm_body_retention_days"))
    deleted = 0
    for tenant_id in sorted(tenant_ids):
        with tenant_scope(tenant_id):
            old = LLMCallBody.objects.all()
            if policies.get(tenant_id):
                old = old.filter(Q(created_at__lt=now - timedelta(days=days[tenant_id])))
            ids = list(old.order_by("created_at").values_list("pk", flat=True)[:PURGE_BATCH])
            if ids:
                deleted += LLMCallBody.objects.filter(pk__in=ids).delete()[0]
    return deleted


__all__ = ["BODY_COLUMNS", "PURGE_BATCH", "body_columns", "body_cut", "body_max_bytes", "llm_bodies_purge"]
