"""Model calls outside a run's turns, metered as LLM calls: chat titles, memory extraction and
merge, a knowledge search's query rewrite and rerank, an experiment's LLM judge.

A run's model turns and compactions are written by the runner (``sessions.runs.llm_call_record``). Every other
model call goes through a :class:`MeteredRoute`: a route's entries (the router's retries and
fallback) bound to a :class:`CallSite` (tenant, purpose, agent, user, the entries' ids). Before
each call the tenant's monthly budget is asked (:class:`BudgetExceeded` when it is spent: the
call is not made); after it, each attempt, fallbacks and failures included, is handed to the
meter, which writes it as an ``LLMCall`` row of that purpose (no run), so usage pages and the
monthly budget count it.

The meter is a port (:class:`Meter`): ``llm`` sits below ``sessions``, which owns the
``LLMCall`` table and registers its meter when Django starts (``sessions.apps``). Without a
registered meter, calls are neither checked nor recorded (a process without the ``sessions``
app).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import models

from llm.config import RouteEntryConfig
from llm.errors import LLMError
from llm.model import ModelSettings
from llm.records import AttemptRecord
from llm.router import Router
from llm.types import ChatMessage, Completion

logger = logging.getLogger(__name__)

BUDGET_RECHECK_SECONDS = 5.0
"""How long a :class:`MeteredRoute` used from a run's loop trusts its last budget answer (a
rerank asks the model once per passage, at once: one budget query serves them all)."""


class LLMCallPurpose(models.TextChoices):
    """Why a model was called (``LLMCall.purpose``)."""

    TURN = "turn", "Run turn"
    TITLE = "title", "Chat title"
    MEMORY = "memory", "Memory extraction"
    QUERY_REWRITE = "query_rewrite", "Query rewrite"
    RERANK = "rerank", "Rerank"
    COMPACTION = "compaction", "Compaction"
    """A run's context compaction: the summary of the conversation's oldest part, written by
    the run's own route (``sessions.runner.compaction``), so its rows keep their run and turn."""
    EVALUATION = "evaluation", "Evaluation"
    """An experiment's LLM judge grading an answer (``evaluation.scoring``; no run or turn)."""
    GUARDRAIL = "guardrail", "Guardrail"
    """A guardrail's model check of a run's text (``guardrails.checks``, asked by
    ``sessions.runner.guarding``; its rows carry the run's agent and user, no run or turn)."""
    SAMPLING = "sampling", "MCP sampling"
    """An MCP server's ``sampling/createMessage`` during one of a run's tool calls, answered by
    the run's own route (``sessions.runner.sampling``): its rows keep their run and turn, so the
    run's totals and budgets count it."""


class BudgetExceeded(LLMError):
    """The tenant's monthly model budget is spent: the call was not made. ``str(exc)`` says
    how much of how much (for logs and API callers; no provider text)."""


@dataclass(frozen=True, slots=True)
class CallSite:
    """Whom a model call outside a run's turns is made for: the columns of its ``LLMCall``
    rows besides the attempt's own."""

    tenant_id: int
    purpose: str
    """An :class:`LLMCallPurpose` value other than ``turn`` (and ``compaction``, which a run
    records itself)."""
    entry_ids: tuple[int | None, ...] = ()
    """``ModelRouteEntry`` ids parallel to the route's entries (an attempt's ``entry_index``
    picks its row's ``route_entry``); shorter or empty: no route entry on the row."""
    agent_id: int | None = None
    """The agent the call serves (``agents.AgentInstance`` id), if any."""
    user_id: int | None = None
    """The member the call serves (the chat's user, the searching member), if any."""


class Meter(Protocol):
    """What records and limits metered calls (registered by the app that owns ``LLMCall``).

    Both methods are blocking ORM code: call them from a thread without a running loop, in
    ``site.tenant_id``'s tenant scope.
    """

    def budget_refusal(self, site: CallSite) -> str:
        """Why a call for ``site`` is refused now (the tenant's monthly budget is spent), or ""."""
        ...

    def record(self, site: CallSite, attempts: Sequence[AttemptRecord]) -> None:
        """Write one ``LLMCall`` row per attempt (in order) for ``site``, and the attempts'
        bodies (``AttemptRecord.bodies``) when the tenant records them."""
        ...


_meter: Meter | None = None


def meter_register(meter: Meter | None) -> Meter | None:
    """Make ``meter`` the process's meter (None: none); returns the one it replaces."""
    global _meter
    previous, _meter = _meter, meter
    return previous


def meter_get() -> Meter | None:
    """The process's meter, or None when no app registered one."""
    return _meter


InThread = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]
"""``in_thread(fn)(**kwargs)``: run blocking ORM code on a thread, in the caller's tenant scope
(a run's ``OpenContext.in_thread``)."""


class MeteredRoute:
    """A route's entries as a model caller for one :class:`CallSite`: each call is checked
    against the tenant's budget first, and each of its attempts becomes an ``LLMCall`` row.

    Args:
        entries: The route, in order (``entries[i].index == i``), as
            :func:`llm.selectors.route_entry_config` builds them; a caller may lower
            ``max_retries`` (titles: none).
        site: Whom the calls are for.

    Use :meth:`complete_sync` from blocking code (a Celery task, a request thread) and
    :meth:`complete` from a running event loop (a run's tool).
    """

    def __init__(self, entries: Sequence[RouteEntryConfig], site: CallSite) -> None:
        self.site = site
        # Bodies are captured for every metered call and kept only for a tenant that records
        # them (the meter decides when it writes the attempts; ``sessions.llm_bodies``).
        self.router = Router(list(entries), record=self._keep, capture_bodies=True)
        self._pending: list[AttemptRecord] = []
        self._lock: asyncio.Lock | None = None
        self._checked: tuple[float, str] | None = None

    async def _keep(self, attempt: AttemptRecord) -> None:
        logger.info("%s call (tenant %s) to %s:%s %s: %s prompt + %s completion tokens, %s micro-USD",
                    self.site.purpose, self.site.tenant_id, attempt.provider_name, attempt.model, attempt.status,
                    attempt.prompt_tokens, attempt.completion_tokens, attempt.cost_usd_micros)
        self._pending.append(attempt)

    def _take(self) -> list[AttemptRecord]:
        taken, self._pending = self._pending, []
        return taken

    def complete_sync(
        self, messages: Sequence[ChatMessage], *, settings: ModelSettings | None = None,
        max_output_tokens: int | None = None,
    ) -> Completion:
        """One call, blocking (its own event loop): budget check, the call, then its attempts
        written (also when it failed). Call from a thread without a running loop, in the
        site's tenant scope.

        Raises:
            BudgetExceeded: the tenant's monthly budget is spent (nothing called, nothing written).
            LLMError: the route failed (its failed attempts are written).
        """
        meter = meter_get()
        if meter is not None:
            refusal = meter.budget_refusal(self.site)
            if refusal:
                raise BudgetExceeded(refusal)
        try:
            return asyncio.run(self.router.complete(messages, [], settings, max_output_tokens=max_output_tokens))
        finally:
            attempts = self._take()
            if meter is not None and attempts:
                meter.record(self.site, attempts)

    async def complete(
        self, messages: Sequence[ChatMessage], *, in_thread: InThread, settings: ModelSettings | None = None,
        max_output_tokens: int | None = None,
    ) -> Completion:
        """One call from a running loop: the budget check (its answer reused for
        :data:`BUDGET_RECHECK_SECONDS`) and the writes go through ``in_thread``.

        Raises:
            BudgetExceeded: the tenant's monthly budget is spent (nothing called, nothing written).
            LLMError: the route failed (its failed attempts are written).
        """
        meter = meter_get()
        if meter is not None:
            refusal = await self._refusal(meter, in_thread)
            if refusal:
                raise BudgetExceeded(refusal)
        try:
            return await self.router.complete(messages, [], settings, max_output_tokens=max_output_tokens)
        finally:
            attempts = self._take()
            if meter is not None and attempts:
                await in_thread(meter.record)(self.site, attempts)

    async def _refusal(self, meter: Meter, in_thread: InThread) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now = time.monotonic()
            if self._checked is None or now - self._checked[0] > BUDGET_RECHECK_SECONDS:
                self._checked = (now, await in_thread(meter.budget_refusal)(self.site))
            return self._checked[1]


__all__ = [
    "BUDGET_RECHECK_SECONDS", "BudgetExceeded", "CallSite", "InThread", "LLMCallPurpose", "Meter", "MeteredRoute",
    "meter_get", "meter_register",
]
