"""The meter of model calls outside a run's turns (:mod:`llm.metering`): their ``LLMCall``
rows and the tenant's monthly budget.

:func:`llm_calls_record` is the one function that writes those rows (chat titles, memory
extraction and merge, a knowledge search's query rewrite and rerank; a run's own turns are
written by :func:`sessions.runs.llm_call_record`). :func:`llm_call_budget_refusal` refuses a
call once the tenant's LLM calls of this calendar month (UTC) cost its ``monthly_budget_usd``
or more. :class:`LLMCallMeter` is both, registered as the process's meter when Django starts
(``sessions.apps``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from llm.metering import CallSite, LLMCallPurpose
from llm.records import AttemptRecord
from llm.sanitize import clean_text
from sessions.llm_bodies import body_columns
from sessions.models import LLMCall, LLMCallBody
from sessions.selectors import tenant_month_cost_usd_micros
from tenants.models import Tenant
from tenants.scoping import require_tenant_id


def llm_calls_record(*, site: CallSite, attempts: Sequence[AttemptRecord]) -> list[LLMCall]:
    """Write one ``LLMCall`` row per attempt of a call made for ``site`` (in order, one
    transaction): no run or turn, ``purpose``/``agent``/``user`` from the site, the route
    entry from ``site.entry_ids[attempt.entry_index]``, the attempt's tokens, cost, latency
    and outcome (errors cut to 5,000 characters); and each attempt's model call record
    (:mod:`sessions.llm_bodies`) when it carries bodies and the tenant records them.

    Returns:
        The rows written.

    Raises:
        ValueError: ``site.purpose`` is ``turn`` or unknown, or ``site.tenant_id`` is not the
        current tenant.

    Requires tenant scope (``site.tenant_id``'s).
    """
    if site.purpose not in LLMCallPurpose.values or site.purpose == LLMCallPurpose.TURN:
        raise ValueError(f"not a purpose of a call outside a run's turns: {site.purpose!r}")
    if site.tenant_id != require_tenant_id():
        raise ValueError(f"call site of tenant {site.tenant_id} recorded in tenant {require_tenant_id()}'s scope")
    now = timezone.now()
    rows = [
        LLMCall(
            tenant_id=site.tenant_id, run=None, turn=None, purpose=site.purpose, agent_id=site.agent_id,
            user_id=site.user_id, attempt=a.attempt,
            route_entry_id=site.entry_ids[a.entry_index] if 0 <= a.entry_index < len(site.entry_ids) else None,
            entry_index=a.entry_index, provider_name=a.provider_name, model=a.model, status=a.status,
            error_class=a.error_class or "", error=clean_text(a.error[:5000]), latency_ms=max(0, a.latency_ms),
            first_token_ms=a.first_token_ms, prompt_tokens=a.prompt_tokens, completion_tokens=a.completion_tokens,
            usage_estimated=a.usage_estimated, cost_usd_micros=a.cost_usd_micros, retry_wait_ms=a.retry_wait_ms,
            created_at=now,
        )
        for a in attempts
    ]
    with transaction.atomic():
        written = LLMCall.objects.bulk_create(rows)
        _bodies_record(site=site, attempts=attempts, calls=written, now=now)
    return written


def _bodies_record(*, site: CallSite, attempts: Sequence[AttemptRecord], calls: list[LLMCall], now: Any) -> None:
    """The model call records of ``calls`` (parallel to ``attempts``), when the attempts carry
    bodies and the tenant records them (one read of its setting, then one INSERT)."""
    if not any(a.bodies is not None for a in attempts):
        return
    if not Tenant.objects.filter(pk=site.tenant_id, record_llm_bodies=True).exists():
        return
    bodies = []
    for attempt, call in zip(attempts, calls, strict=True):
        columns = body_columns(attempt)
        if columns is not None:
            bodies.append(LLMCallBody(tenant_id=site.tenant_id, llm_call=call, created_at=now, **columns))
    LLMCallBody.objects.bulk_create(bodies)


def llm_call_budget_refusal(*, tenant_id: int) -> str:
    """Why a model call outside a run's turns is refused now, or "": the tenant's LLM calls of
    this calendar month (UTC; every purpose) cost its monthly budget or more.

    Requires tenant scope (``tenant_id``'s).
    """
    budget = Tenant.objects.filter(pk=tenant_id).values_list("monthly_budget_usd", flat=True).first()
    if budget is None:
        return ""
    limit = int(budget * 1_000_000)
    spent = tenant_month_cost_usd_micros()
    if spent < limit:
        return ""
    return f"The tenant has used ${spent / 1e6:.2f} of its ${limit / 1e6:.2f} monthly model budget."


class LLMCallMeter:
    """:class:`llm.metering.Meter` over :func:`llm_call_budget_refusal` and :func:`llm_calls_record`."""

    def budget_refusal(self, site: CallSite) -> str:
        return llm_call_budget_refusal(tenant_id=site.tenant_id)

    def record(self, site: CallSite, attempts: Sequence[AttemptRecord]) -> None:
        llm_calls_record(site=site, attempts=attempts)
