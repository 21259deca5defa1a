"""Runs started from outside the chat app: what every door to an agent shares.

The OpenAI-compatible API (:mod:`sessions.api.openai_compat`) and the agents' MCP server
(:mod:`sessions.api.mcp_agents`) start an ordinary run of an agent named by its slug and read its
answer from the session's events. The rules are the same behind both doors, so they are written
once here, in the protocol's neutral terms (a :class:`RunRefused` with an HTTP-like status and a
short code); each door words the refusal in its own protocol's shape:

- :func:`agent_run_start`: the caller's active agent by slug (another tenant's is the same "not
  found" as a missing one), the ``messages`` and ``runs`` throttles (:data:`THROTTLE_SCOPES`,
  those of posting a message in the app), then the post (a new chat, or the next message of one:
  :func:`chat_continue`), in the caller's tenant scope.
- :func:`answer_reader_open`: the session's one event reader
  (:class:`sessions.event_reader.SessionEventReader`) on one of the caller's stream slots (open
  answers count like open event streams); :func:`answer_slot_take` and :func:`answer_reader` for
  a door that takes the slot before the run starts.
- :func:`run_start_gate`: how many runs a web process starts at once (the rest wait their turn);
  the chat app's run-starting POSTs take it too (``agent_platform.asgi.RUN_STARTING_POST``).
- :func:`person_decision_note`: what a door answers when the run pauses for a person's decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.conf import settings

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from agents.versions import VersionError, run_pin, split_pinned_slug
from sessions import stream_guard
from sessions.event_reader import SessionEventReader
from sessions.models import ACTIVE_RUN_STATUSES, Run
from sessions.runs.transitions import unattended_runs
from sessions.selectors import chat_session_get_for_user
from sessions.services import message_post
from sessions.stream_guard import StreamCredential
from tenants.resolution import Caller
from tenants.scoping import tenant_scope
from tenants.throttling import throttle_wait

THROTTLE_SCOPES = ("messages", "runs")
"""The budgets a run started from outside spends (those of posting a message in the app)."""

AGENT_NOT_FOUND = "agent_not_found"
""":attr:`RunRefused.code` of an agent the caller may not use (missing, inactive, another tenant's)."""


class RunRefused(Exception):
    """A run was not started, or its answer cannot be read.

    Args:
        status: The HTTP status the refusal means: 400 a message the chat refuses, 404 no such
            agent or chat for the caller, 409 the chat has a run in progress, 429 a throttle or
            too many open answers, else the :class:`ApplicationError`'s own.
        message: For the caller: what is wrong and what to do.
        code: Short and machine-readable: :data:`AGENT_NOT_FOUND`, ``chat_not_found``,
            ``chat_busy``, ``rate_limit_exceeded``, ``too_many_streams``, or None.
        param: The request field at fault, when one is (as the door names it).
        retry_after: Seconds to wait (429), else None.
    """

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.retry_after = status, message, code, param, retry_after


def agent_run_start(caller: Caller, slug: str, post: Callable[[AgentInstance], Run]) -> tuple[int, int]:
    """Post a request as a run of the caller's active agent ``slug``: ``(session id, run id)``.
    ``slug@<n>`` runs the agent's version ``n`` (:func:`agents.versions.split_pinned_slug`),
    else its published version.
    ``post(agent)`` writes it (a new chat, or the next message of one), in the caller's tenant
    scope. Blocking (ORM, cache).

    Raises:
        RunRefused: 404 :data:`AGENT_NOT_FOUND`, 429 ``rate_limit_exceeded`` (a throttle of
            :data:`THROTTLE_SCOPES`), or what ``post`` refuses (an :class:`ApplicationError`
            becomes a RunRefused of its status and message).
    """
    membership = caller.membership
    base_slug, number = split_pinned_slug(slug)
    with tenant_scope(membership.tenant_id):
        agent = AgentInstance.objects.filter(slug=base_slug, is_active=True).first()
        if agent is None:
            raise RunRefused(404, f"No agent `{slug}` is yours to use.", code=AGENT_NOT_FOUND)
        wait = throttle_wait(scopes=THROTTLE_SCOPES, user_id=caller.user.pk, tenant_id=membership.tenant_id)
        if wait is not None:
            raise RunRefused(429, "Too many requests; try again later.", code="rate_limit_exceeded",
                             retry_after=max(1, int(wait + 0.999)))
        try:
            with run_pin(number=number), unattended_runs():  # nobody watches an API run
                run = post(agent)
        except VersionError as exc:
            raise RunRefused(404, f"No agent `{slug}` is yours to use ({exc})", code=AGENT_NOT_FOUND) from exc
        except ApplicationError as exc:
            raise RunRefused(exc.status_code, exc.message) from exc
        return run.session_id, run.pk


def chat_continue(caller: Caller, agent: AgentInstance, *, chat_id: int, content: str, param: str | None = None,
                  request_options: dict[str, Any] | None = None) -> Run:
    """Post ``content`` as the next message of the caller's chat ``chat_id`` with ``agent``
    (its stored history applies; ``request_options``: what the caller asked of the run,
    ``Run.request_options``). In the caller's tenant scope (inside :func:`agent_run_start`'s
    ``post``).

    Raises:
        RunRefused: 404 ``chat_not_found`` (not the caller's chat, or another agent's), 409
            ``chat_busy`` (a run of the chat is queued, running or waiting for an approval).
        ApplicationError: an empty or over-long message (:func:`sessions.services.message_post`).
    """
    session = chat_session_get_for_user(session_id=chat_id, user_id=caller.user.pk)
    if session is None or session.agent_id != agent.pk:
        raise RunRefused(404, f"No chat {chat_id} with `{agent.slug}` is yours.", param=param, code="chat_not_found")
    if Run.objects.filter(session=session, status__in=ACTIVE_RUN_STATUSES).exists():
        raise RunRefused(409, "This chat has a run in progress; wait for it to end.", code="chat_busy")
    return message_post(session=session, user=caller.user, content=content, request_options=request_options)


_start_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


@contextlib.asynccontextmanager
async def run_start_gate() -> AsyncIterator[None]:
    """Hold one of the event loop's ``WEB_RUN_STARTS_MAX`` turns to start a run (0: no limit);
    wait for one when all are held. A door starts its run (:func:`agent_run_start`, in a thread)
    inside it.

    Why: each start is ORM and cache work (~20 ms of CPU) in a thread of its own under Django's
    ASGI handler, and all of them hold the GIL the loop needs to deliver other answers' tokens.
    With 200 streaming chat completions sent at once on 2 cores (AMD EPYC), a token's p95 from
    the worker to the client was 115 ms with no limit, 51-53 ms with two starts at a time and
    38-43 ms with one (the default), the wall time ~12 % longer and the CPU per request the same
    (``bench/openai_stream_fanout.py``; figures in bench/README.md). A waiter that is cancelled
    (its client went away) leaves the queue; the turn is freed however the start ends.
    """
    limit = settings.WEB_RUN_STARTS_MAX
    if limit <= 0:
        yield
        return
    loop = asyncio.get_running_loop()
    held = _start_gates.get(loop)
    if held is None or held[0] != limit:  # one per loop: a Semaphore is bound to the loop that first waits on it
        held = _start_gates[loop] = (limit, asyncio.Semaphore(limit))
    async with held[1]:
        yield


async def answer_slot_take(caller: Caller) -> str:
    """One of the caller's stream slots for an answer, taken before its run starts (a refused
    slot starts no run); freed by the reader's ``close()`` (:func:`answer_reader`), or by
    :func:`answer_slot_release` if no reader is made.

    Raises:
        RunRefused: 429 ``too_many_streams`` when the caller holds every slot
            (:func:`sessions.stream_guard.streams_per_user_max`).
    """
    slot = await stream_guard.stream_slot_acquire(user_id=caller.user.pk)
    if slot is None:
        raise RunRefused(429, f"Too many open answers (at most {stream_guard.streams_per_user_max()} per user).",
                         code="too_many_streams", retry_after=15)
    return slot


async def answer_slot_release(caller: Caller, slot: str) -> None:
    """Free a slot of :func:`answer_slot_take` that no reader took (its run did not start)."""
    await stream_guard.stream_slot_release(user_id=caller.user.pk, slot=slot)


def answer_reader(caller: Caller, session_id: int, *, slot: str, after_seq: int = 0) -> SessionEventReader:
    """The reader of the session's events for the caller's answer (after ``after_seq``; 0: from
    its first frame) on ``slot``; not yet opened (the door calls ``open()`` and, always,
    ``close()``, which frees the slot)."""
    credential = StreamCredential(user_id=caller.user.pk, membership_id=caller.membership.pk,
                                  token_id=caller.token.pk if caller.token is not None else None,
                                  oauth_grant_id=caller.oauth_grant_id)
    return SessionEventReader(session_id=session_id, after_seq=after_seq, credential=credential, slot=slot)


async def answer_reader_open(caller: Caller, session_id: int, *, after_seq: int = 0) -> SessionEventReader:
    """:func:`answer_slot_take`, then :func:`answer_reader` on it.

    Raises:
        RunRefused: 429 ``too_many_streams`` (see :func:`answer_slot_take`).
    """
    return answer_reader(caller, session_id, slot=await answer_slot_take(caller), after_seq=after_seq)


def person_decision_note(approvals: list[dict[str, Any]], *, base_url: str, chat_id: int) -> tuple[str, str]:
    """What a door answers when its run paused for a person's decision: ``(note, url)``, the
    chat's URL in the chat app (``<base_url>/#/sessions/<chat_id>``, where the decision is made)
    and one plain sentence naming the tools waiting (``approvals``: the
    ``run_awaiting_approval`` event's, ``[{tool_name?, ...}]``), the URL and the chat id."""
    url = f"{base_url.rstrip('/')}/#/sessions/{chat_id}"
    names = ", ".join(a["tool_name"] for a in approvals if a.get("tool_name"))
    note = (f"The agent is waiting for a person's decision{f' on {names}' if names else ''}. Decide in the chat app: "
            f"{url} . The run goes on in that chat (chat_id {chat_id}) once decided.")
    return note, url
