"""After a chat's first exchange: hand the chat to the title task.

A chat is titled at once from its first message (:func:`sessions.chat_services.chat_title_from`);
once its first run completes, :func:`title_after_first_exchange` (called by the run's end,
:func:`sessions.runner.loop._finish`) sends ``sessions.chat_session_title_generate`` to a worker
(through the hand-off the app registers, :func:`sessions.runs.handoff.chat_title_hand_off`),
which asks the agent's route for a short title (:func:`sessions.chat_services.chat_session_title_generate`).

One query on the loop's connection decides whether the run is the chat's first completed run;
later runs cost nothing more. ``CHAT_TITLES_FROM_MODEL`` (default on) switches it off.
"""

from __future__ import annotations

import asyncio
import logging

from sessions.models import Run, RunStatus
from sessions.runner.pg import pg_connection
from sessions.runner.spec import RunSpec
from sessions.runs.handoff import chat_title_hand_off

logger = logging.getLogger(__name__)

_EARLIER_ANSWER_SQL = (
    f'SELECT 1 FROM "{Run._meta.db_table}" WHERE "tenant_id" = %(tenant_id)s AND "session_id" = %(session_id)s '
    'AND "parent_tool_call_id" IS NULL AND "superseded_at" IS NULL AND "status" = %(completed)s '
    'AND "id" < %(run_id)s LIMIT 1'
)
"""An earlier completed (not superseded) user run of the session: then the chat has its title."""


def titles_enabled() -> bool:
    """``settings.CHAT_TITLES_FROM_MODEL`` (default True)."""
    from django.conf import settings

    return bool(getattr(settings, "CHAT_TITLES_FROM_MODEL", True))


async def title_after_first_exchange(spec: RunSpec) -> bool:
    """Send the title task for ``spec``'s chat if ``spec`` (a user's run that just completed)
    is the chat's first completed run. Never raises: a failure is logged, the run is not
    affected (it has ended already).

    Returns:
        Whether the task was sent.

    Requires tenant scope (the run's).
    """
    if spec.depth != 0 or not titles_enabled():
        return False
    try:
        async with pg_connection() as conn:
            cursor = await conn.execute(_EARLIER_ANSWER_SQL, {
                "tenant_id": spec.tenant_id, "session_id": spec.session_id, "run_id": spec.run_id,
                "completed": RunStatus.COMPLETED.value,
            })
            if await cursor.fetchone() is not None:
                return False
        await asyncio.to_thread(chat_title_hand_off, session_id=spec.session_id, run_id=spec.run_id,
                                tenant_id=spec.tenant_id)  # a Celery publish: blocking I/O, no database
        return True
    except Exception:  # noqa: BLE001 - a title is never worth failing anything for
        logger.warning("run %s: could not hand its chat to the title task", spec.run_id, exc_info=True)
        return False
