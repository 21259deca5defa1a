"""Handing work to workers: a port of :mod:`sessions.runs`, filled when the app starts.

The lifecycle decides *when* a run may start (its creation, a resume after approvals, a slot
or a session freed by a run's end, the sweeper's re-send) and the runner decides when a chat
gets its title, but the queue that carries them to a worker (:mod:`sessions.tasks`: Celery)
sits above both: its tasks run the runner, which calls the lifecycle. So neither imports it;
:class:`sessions.apps.AgentSessionsConfig.ready` registers the senders once
(:func:`workers_register`), and :func:`run_hand_off` / :func:`chat_title_hand_off` call them.

Nothing is registered before the app is ready (``django.setup()``): a hand-off then raises
:class:`RuntimeError` instead of dropping the run. Tests that execute runs themselves patch the
task module's sender (``sessions.tasks.run_enqueue``, the ``no_enqueue`` fixture): the
registered senders look it up at each call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from asgiref.sync import sync_to_async
from django.db import transaction

from tenants.scoping import current_tenant_id

RunHandOff = Callable[[int, "int | None"], None]
"""``send(run_id, tenant_id)``: hand run ``run_id`` to a worker; ``tenant_id`` (its tenant, or
None: the worker looks it up) spares the worker a lookup. Sending twice is harmless: the claim
decides who runs it. Blocking I/O (a broker publish), no database."""


class ChatTitleHandOff(Protocol):
    """``send(session_id=, run_id=, tenant_id=)``: hand chat ``session_id``, whose first run
    ``run_id`` completed, to the title task. Blocking I/O (a broker publish), no database."""

    def __call__(self, *, session_id: int, run_id: int, tenant_id: int) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkerHandOff:
    """The senders the app registers (production: :mod:`sessions.tasks`' Celery senders)."""

    run: RunHandOff
    """Hands a run to a worker (:data:`RunHandOff`)."""
    chat_title: ChatTitleHandOff
    """Hands a chat to the title task (:class:`ChatTitleHandOff`)."""


_workers: WorkerHandOff | None = None


def workers_register(hand_off: WorkerHandOff) -> None:
    """Make ``hand_off`` the process's senders (replacing any registered before). Called once,
    from :meth:`sessions.apps.AgentSessionsConfig.ready`."""
    global _workers
    _workers = hand_off


def workers() -> WorkerHandOff:
    """The registered senders.

    Raises:
        RuntimeError: none registered (the ``sessions`` app is not ready: no ``django.setup()``).
    """
    if _workers is None:
        raise RuntimeError("No worker hand-off is registered: the sessions app is not ready (django.setup()).")
    return _workers


def run_hand_off(run_id: int, tenant_id: int | None = None) -> None:
    """Hand run ``run_id`` to a worker now (see :data:`RunHandOff`); blocking, no database.

    Raises:
        RuntimeError: no hand-off registered (:func:`workers`).
    """
    workers().run(run_id, tenant_id)


def run_enqueue_on_commit(*, run_id: int) -> None:
    """Hand the run to a worker once the transaction commits (with the tenant in context, if
    one: callers work in the run's tenant). Sending twice is harmless: the claim decides."""
    tenant_id = current_tenant_id()
    transaction.on_commit(lambda: run_hand_off(run_id, tenant_id))


async def runs_hand_to_workers(run_ids: list[int]) -> None:
    """Hand runs of the caller's tenant to workers (each claim re-checks that it may start),
    from the run host's loop: the sends run on a thread (a broker publish blocks)."""
    for run_id in run_ids:
        await sync_to_async(run_hand_off)(run_id, current_tenant_id())


def chat_title_hand_off(*, session_id: int, run_id: int, tenant_id: int) -> None:
    """Hand chat ``session_id`` to the title task (see :class:`ChatTitleHandOff`); blocking.

    Raises:
        RuntimeError: no hand-off registered (:func:`workers`).
    """
    workers().chat_title(session_id=session_id, run_id=run_id, tenant_id=tenant_id)
