"""Writes of memories: extraction from a session, merging, recall at a run's start, deletion, retention.

Extraction (:func:`memory_extract_session`) reads a session's messages past its watermark in
batches; for each batch the agent's model route is asked for durable facts and preferences
about the user (strict JSON, :mod:`memory.extraction`); each candidate is embedded and
compared with the user+agent's memories by cosine similarity:

- the same text (but for case, spacing, final punctuation) or similarity ≥
  :data:`DUPLICATE_SIMILARITY` to an existing memory → a near duplicate: that memory is
  confirmed (``updated_at`` touched; retention counts from there);
- some memories ≥ :data:`RELATED_SIMILARITY` → the model decides, as mem0 does, ``ADD``,
  ``UPDATE <id>`` (reworded, merged), ``DELETE <id>`` (a contradiction: replaced) or ``NONE``;
- otherwise → added.

The batch's changes and the new watermark are written in one transaction, so a batch is
applied once or not at all. An answer that is not the JSON asked for, or a failing model or
embedding provider, leaves the watermark where it was and sets ``retry_after`` (backoff);
after :data:`MAX_MALFORMED_ATTEMPTS` malformed answers for one batch the batch is skipped.

Model calls go through the agent's route (retries and fallback as for runs) as
:class:`llm.metering.MeteredRoute` calls: each attempt is an LLM call of purpose ``memory``
for the session's agent and user, counted in usage and in the tenant's monthly budget. With
that budget spent, a batch's call is refused (:class:`llm.metering.BudgetExceeded`, an
``LLMError``): the batch fails like any model failure and is retried after its backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from llm.errors import LLMError
from llm.metering import CallSite, LLMCallPurpose, MeteredRoute
from llm.model import ModelSettings
from llm.selectors import route_entries, route_entry_config
from llm.types import ChatMessage
from memory import extraction
from memory.extraction import Candidate, MalformedAnswer, TranscriptLine
from memory.models import Memory, MemoryExtraction
from memory.policy import DEFAULT_RETENTION_DAYS
from memory.selectors import Similar, memory_agents_enabled, memory_policy_for_agent, memory_similar
from sessions.models import ChatSession, Message, MessageRole
from tenants.models import Tenant

logger = logging.getLogger(__name__)

DUPLICATE_SIMILARITY = 0.97
"""Cosine similarity from which a candidate is the same memory (confirmed, not asked about).
High on purpose: with all-MiniLM-L6-v2, "Prefers answers in French." is 0.82 from "... in
English." (a contradiction) and 0.92 from "Prefers short answers in French." (a refinement);
both must reach the model. Texts equal but for case, spacing and final punctuation count as
duplicates whatever their similarity (the same model puts "...French." 0.945 from "...French")."""
RELATED_SIMILARITY = 0.4
"""Cosine similarity from which existing memories are shown to the model for a merge decision
(all-MiniLM-L6-v2: "Lives in Lyon." / "Moved to Berlin." 0.45, "Is vegetarian." / "Eats meat
again." 0.48; unrelated facts 0.05–0.16; measured through the embedded llama.cpp server)."""
RELATED_LIMIT = 5
"""Existing memories shown for one decision, at most."""
BATCH_MESSAGES = 40
"""Messages read per extraction call, at most."""
BATCH_CHARS = 12_000
"""Transcript characters per extraction call, about (a batch holds at least one message)."""
MAX_BATCHES = 5
"""Batches one extraction works through before it leaves the rest for the next."""
EXTRACT_MAX_OUTPUT_TOKENS = 768
DECIDE_MAX_OUTPUT_TOKENS = 256
LEASE_SECONDS = 600
"""How long an extraction holds a session (longer than any model call it makes)."""
MAX_MALFORMED_ATTEMPTS = 5
"""Malformed answers for one batch after which the batch is skipped (logged)."""
MAX_QUERY_CHARS = 4_000
"""A run's user message is cut to this many characters before it is embedded for recall."""
RETRY_BASE_SECONDS = 300
RETRY_MAX_SECONDS = 24 * 3600


class MemoryServiceError(Exception):
    """Base of the memory app's errors (``message`` is shown to the caller)."""


class MemoryOff(MemoryServiceError):
    """The session's agent has no memory binding."""


class ExtractionBusy(MemoryServiceError):
    """Another extraction holds the session, or a failure asked to wait (``retry_after``)."""


# --- embedding -------------------------------------------------------------------------------


def embedder(*, tenant_id: int) -> tuple[Any, str]:
    """``(provider, model)`` memories of ``tenant_id`` are embedded with: the tenant's default
    embedding provider and model (``llm.embeddings``). Requires tenant scope."""
    from llm.embeddings import DEFAULT_EMBEDDING_MODEL, default_embedding_provider

    return default_embedding_provider(Tenant.objects.get(pk=tenant_id)), DEFAULT_EMBEDDING_MODEL


def embed(provider: Any, model: str, texts: Sequence[str]) -> list[list[float]]:
    """Embeddings of ``texts`` (one per text, L2-normalised), one blocking HTTP call.

    Raises:
        EmbeddingError: the provider failed or answered the wrong number of vectors.
    """
    from llm.embeddings import embed_texts

    return embed_texts(provider, model, list(texts)) if texts else []


# --- recall ----------------------------------------------------------------------------------


def memory_recall(*, user_id: int, agent_id: int, embedding: Sequence[float], embedding_model: str,
                  limit: int) -> list[Memory]:
    """The ``limit`` memories of the user+agent most similar to ``embedding``; their
    ``last_used_at`` is set to now. Requires tenant scope."""
    found = [s.memory for s in memory_similar(user_id=user_id, agent_id=agent_id, embedding=embedding,
                                              embedding_model=embedding_model, limit=limit)]
    if found:
        Memory.objects.filter(pk__in=[m.pk for m in found]).update(last_used_at=timezone.now())
    return found


def _recall_prepare(*, tenant_id: int, user_id: int, agent_id: int) -> tuple[Any, str] | None:
    """The embedding endpoint (key decrypted) and model, or None when the user has no memories
    with this agent (nothing to embed then)."""
    if not Memory.objects.filter(user_id=user_id, agent_id=agent_id).exists():
        return None
    from llm.embeddings import embedding_endpoint

    provider, model = embedder(tenant_id=tenant_id)
    return embedding_endpoint(provider), model


async def memory_recall_async(
    *, tenant_id: int, user_id: int, agent_id: int, query: str, limit: int,
    in_thread: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]],
) -> list[Memory]:
    """:func:`memory_recall` for the run-start hook: the database work through ``in_thread``
    (the run's database thread, its tenant scope), ``query`` embedded on the caller's loop.

    Returns:
        Up to ``limit`` memories, most similar first; ``[]`` without memories (no embedding
        call then).

    Raises:
        EmbeddingError: the embedding provider failed.
    """
    from llm.embeddings import aembed_texts

    prepared = await in_thread(_recall_prepare)(tenant_id=tenant_id, user_id=user_id, agent_id=agent_id)
    if prepared is None:
        return []
    endpoint, model = prepared
    [vector] = await aembed_texts(endpoint, model, [query[:MAX_QUERY_CHARS]])
    return await in_thread(memory_recall)(user_id=user_id, agent_id=agent_id, embedding=vector,
                                          embedding_model=model, limit=limit)


# --- deletion and retention ------------------------------------------------------------------


def memory_delete(*, memory: Memory) -> None:
    """Delete one memory (the caller checked it is the user's). Requires tenant scope."""
    Memory.objects.filter(pk=memory.pk).delete()


def memory_delete_all(*, user_id: int, agent_id: int) -> int:
    """Delete every memory of the user with the agent; returns how many. Requires tenant scope."""
    deleted, _ = Memory.objects.filter(user_id=user_id, agent_id=agent_id).delete()
    return deleted


def memories_expire(*, now: datetime | None = None) -> int:
    """Delete memories not updated for their agent's ``retention_days`` (agents whose memory is
    off: :data:`~memory.policy.DEFAULT_RETENTION_DAYS`). Runs in system scope (beat task).

    Returns:
        How many memories were deleted.
    """
    now = now or timezone.now()
    enabled = memory_agents_enabled()
    retention = {agent_id: policy.retention_days for agent_id, (_t, policy) in enabled.items()}
    by_days: dict[int, list[int]] = {}
    # tenant-bypass: retention covers every tenant (system scope, beat task).
    for agent_id in Memory.all_tenants.values_list("agent_id", flat=True).distinct():
        by_days.setdefault(retention.get(agent_id, DEFAULT_RETENTION_DAYS), []).append(agent_id)
    deleted = 0
    for days, agent_ids in by_days.items():
        # tenant-bypass: as above.
        count, _ = Memory.all_tenants.filter(agent_id__in=agent_ids, updated_at__lt=now - timedelta(days=days)).delete()
        deleted += count
    return deleted


# --- extraction ------------------------------------------------------------------------------


@dataclass(slots=True)
class ExtractionOutcome:
    """What one :func:`memory_extract_session` call did."""

    batches: int = 0
    """Batches applied (or skipped after too many malformed answers)."""
    messages: int = 0
    """Messages read in those batches."""
    added: int = 0
    updated: int = 0
    """Existing memories reworded (UPDATE)."""
    replaced: int = 0
    """Contradicted memories replaced (DELETE + the candidate)."""
    confirmed: int = 0
    """Near duplicates and NONE decisions: existing memories touched."""
    error: str = ""
    """Why the last batch failed (it will be retried), or ""."""
    memory_ids: list[int] = field(default_factory=list)
    """Memories written (added, updated or replacing)."""


@dataclass(frozen=True, slots=True)
class _Op:
    """One planned change: ``add`` | ``touch`` | ``update`` | ``replace``."""

    kind: str
    candidate: Candidate | None = None
    target_id: int | None = None
    text: str = ""
    embedding: tuple[float, ...] = ()


def _backoff_seconds(failures: int) -> float:
    return min(RETRY_BASE_SECONDS * 2 ** max(failures - 1, 0), RETRY_MAX_SECONDS)


def _lease(*, session: ChatSession, force: bool) -> MemoryExtraction:
    """Take the session's extraction lease (creating its state row).

    Raises:
        ExtractionBusy: another extraction holds it, or (unless ``force``) a failure asked to wait.
    """
    now = timezone.now()
    state, _ = MemoryExtraction.objects.get_or_create(session=session, defaults={"tenant_id": session.tenant_id})
    free = Q(lease_until__isnull=True) | Q(lease_until__lte=now)
    if not force:
        free &= Q(retry_after__isnull=True) | Q(retry_after__lte=now)
    if not MemoryExtraction.objects.filter(free, pk=state.pk).update(lease_until=now + timedelta(seconds=LEASE_SECONDS)):
        raise ExtractionBusy("An extraction of this session is running or waiting to retry.")
    state.refresh_from_db()
    return state


def _batch(*, session_id: int, after_id: int) -> list[Message]:
    """The next messages past ``after_id`` (a user's run's, not a sub-run's), by id, about
    :data:`BATCH_CHARS` of text at most."""
    rows = list(Message.objects.filter(session_id=session_id, pk__gt=after_id, run__depth=0)
                .only("id", "role", "content").order_by("id")[:BATCH_MESSAGES])
    out, chars = [], 0
    for row in rows:
        if out and chars + len(row.content) > BATCH_CHARS:
            break
        out.append(row)
        chars += min(len(row.content), extraction.TRANSCRIPT_MESSAGE_CHARS)
    return out


def _lines(rows: Sequence[Message]) -> list[TranscriptLine]:
    return [TranscriptLine(role="user" if m.role == MessageRole.USER else "assistant", text=m.content)
            for m in rows if m.role in (MessageRole.USER, MessageRole.ASSISTANT) and m.content.strip()]


def _router(session: ChatSession) -> MeteredRoute:
    """The session's agent's model route, metered as ``memory`` calls for the session's agent
    and user (no shared health)."""
    tenant = Tenant.objects.get(pk=session.tenant_id)
    entries = route_entries(route_id=session.agent.route_id)
    return MeteredRoute(
        [route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries)],
        CallSite(tenant_id=session.tenant_id, purpose=LLMCallPurpose.MEMORY, entry_ids=tuple(e.pk for e in entries),
                 agent_id=session.agent_id, user_id=session.user_id),
    )


def _ask(router: MeteredRoute, system: str, user: str, *, max_output_tokens: int) -> str:
    """One blocking call (its attempts recorded). Raises LLMError (BudgetExceeded included)."""
    completion = router.complete_sync(
        [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)],
        settings=ModelSettings(max_output_tokens=max_output_tokens, temperature=0.0),
    )
    return completion.message.content


def _plan(
    *, router: MeteredRoute, provider: Any, model: str, user_id: int, agent_id: int, candidates: Sequence[Candidate],
) -> list[_Op]:
    """The changes the candidates make to the user+agent's memories (model decisions included).

    Raises:
        MalformedAnswer: a decision was not the JSON asked for.
        LLMError, EmbeddingError: the model or the embedding provider failed.
    """
    vectors = embed(provider, model, [c.text for c in candidates])
    kept: list[tuple[Candidate, list[float]]] = []
    for candidate, vector in zip(candidates, vectors, strict=True):
        if any(_same(candidate.text, c.text, _cosine(vector, v)) for c, v in kept):
            continue  # the same thing said twice in one batch
        kept.append((candidate, vector))
    ops: list[_Op] = []
    rewordings: list[tuple[int, Candidate, str]] = []
    for candidate, vector in kept:
        related = memory_similar(user_id=user_id, agent_id=agent_id, embedding=vector, embedding_model=model,
                                 limit=RELATED_LIMIT, min_similarity=RELATED_SIMILARITY)
        op = _decide(router, candidate, vector, related, rewordings)
        if op is not None:
            ops.append(op)
    if rewordings:  # UPDATE decisions: the merged sentences need their own embeddings
        new_vectors = embed(provider, model, [text for _, _, text in rewordings])
        for (target_id, candidate, text), vector in zip(rewordings, new_vectors, strict=True):
            ops.append(_Op("update", candidate=candidate, target_id=target_id, text=text, embedding=tuple(vector)))
    return ops


def _decide(router: MeteredRoute, candidate: Candidate, vector: list[float], related: list[Similar],
            rewordings: list[tuple[int, Candidate, str]]) -> _Op | None:
    """The op for one candidate; an UPDATE is appended to ``rewordings`` instead (re-embedded later)."""
    if not related:
        return _Op("add", candidate=candidate, text=candidate.text, embedding=tuple(vector))
    if _same(candidate.text, related[0].memory.text, related[0].similarity):
        return _Op("touch", target_id=related[0].memory.pk)
    shown = [(str(i), s.memory) for i, s in enumerate(related, start=1)]
    answer = _ask(router, extraction.DECIDE_PROMPT,
                  extraction.decision_request(candidate, [(i, m.text) for i, m in shown]),
                  max_output_tokens=DECIDE_MAX_OUTPUT_TOKENS)
    decision = extraction.parse_decision(answer, shown_ids=[i for i, _ in shown])
    target = dict(shown).get(decision.id or "")
    if decision.event == "ADD":
        return _Op("add", candidate=candidate, text=candidate.text, embedding=tuple(vector))
    if decision.event == "NONE":
        return _Op("touch", target_id=target.pk) if target is not None else None
    if decision.event == "DELETE":
        return _Op("replace", candidate=candidate, target_id=target.pk, text=candidate.text, embedding=tuple(vector))
    rewordings.append((target.pk, candidate, " ".join((decision.text or "").split())))
    return None


def _normalised(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".!;,: ")


def _same(a: str, b: str, similarity: float) -> bool:
    """Whether two memory texts say the same (see :data:`DUPLICATE_SIMILARITY`)."""
    return similarity >= DUPLICATE_SIMILARITY or _normalised(a) == _normalised(b)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two L2-normalised vectors (their dot product)."""
    return sum(x * y for x, y in zip(a, b, strict=True))


def _apply(*, ops: Sequence[_Op], session: ChatSession, user_id: int, agent_id: int, model: str,
           outcome: ExtractionOutcome) -> None:
    """Write ``ops`` (inside the caller's transaction; each write in a savepoint)."""
    now = timezone.now()
    for op in ops:
        if op.kind == "touch":
            outcome.confirmed += Memory.objects.filter(pk=op.target_id).update(updated_at=now,
                                                                             source_session=session)
            continue
        old = Memory.objects.filter(pk=op.target_id).first() if op.target_id else None
        if op.kind in ("update", "replace") and old is None:
            continue  # the user deleted it meanwhile: do not bring it back
        fields = {"text": op.text, "category": op.candidate.category, "embedding": list(op.embedding),
                  "dimensions": len(op.embedding), "embedding_model": model, "source_session": session,
                  "updated_at": now}
        try:
            with transaction.atomic():
                if op.kind == "update":
                    Memory.objects.filter(pk=old.pk).update(replaced_text=old.text, **fields)
                    written, counter = old.pk, "updated"
                else:
                    if op.kind == "replace":
                        old.delete()
                    row = Memory.objects.create(tenant_id=session.tenant_id, user_id=user_id, agent_id=agent_id,
                                                replaced_text=old.text if old is not None else "", **fields)
                    written, counter = row.pk, "replaced" if op.kind == "replace" else "added"
        except IntegrityError:  # the same sentence is already a memory: confirm that one
            outcome.confirmed += Memory.objects.filter(user_id=user_id, agent_id=agent_id, text=op.text).update(
                updated_at=now, source_session=session)
            continue
        setattr(outcome, counter, getattr(outcome, counter) + 1)
        outcome.memory_ids.append(written)


def _advance(*, state: MemoryExtraction, last_message_id: int) -> None:
    MemoryExtraction.objects.filter(pk=state.pk).update(
        last_message_id=last_message_id, extracted_at=timezone.now(), failures=0, last_error="", retry_after=None,
    )
    state.last_message_id = last_message_id


def _failed(*, state: MemoryExtraction, error: str, skip_to: int | None) -> None:
    """Record a failed batch: retry later with backoff, or skip it (``skip_to``: its last id)."""
    failures = state.failures + 1
    if skip_to is not None:
        logger.warning("memory extraction: session %s: batch up to message %s skipped after %s malformed answers: %s",
                       state.session_id, skip_to, failures, error)
        MemoryExtraction.objects.filter(pk=state.pk).update(last_message_id=skip_to, failures=0, last_error=error,
                                                            retry_after=None)
        state.last_message_id, state.failures = skip_to, 0
        return
    logger.warning("memory extraction: session %s failed (attempt %s), retried later: %s",
                   state.session_id, failures, error)
    MemoryExtraction.objects.filter(pk=state.pk).update(
        failures=failures, last_error=error,
        retry_after=timezone.now() + timedelta(seconds=_backoff_seconds(failures)),
    )
    state.failures = failures


def memory_extract_session(*, session_id: int, force: bool = False) -> ExtractionOutcome:
    """Extract memories from the session's messages past its watermark (see the module docstring).

    Args:
        session_id: A session of the current tenant.
        force: Ignore a failure's ``retry_after`` (on demand); a running extraction still wins.

    Returns:
        What was done; ``error`` is set when a batch failed (it is retried later).

    Raises:
        ChatSession.DoesNotExist: no such session in the current tenant.
        MemoryOff: the session's agent has no memory binding.
        ExtractionBusy: another extraction holds the session (or, without ``force``, a failure
            asked to wait).

    Requires tenant scope. Blocking (model and embedding calls): call it from a Celery task.
    """
    session = ChatSession.objects.select_related("agent").get(pk=session_id)
    if memory_policy_for_agent(agent_id=session.agent_id) is None:
        raise MemoryOff("Memory is off for this agent.")
    state = _lease(session=session, force=force)
    outcome = ExtractionOutcome()
    try:
        router = None
        provider = model = None
        for _ in range(MAX_BATCHES):
            rows = _batch(session_id=session.pk, after_id=state.last_message_id)
            if not rows:
                break
            lines = _lines(rows)
            if not any(line.role == "user" for line in lines):  # nothing the user said: nothing to learn
                _advance(state=state, last_message_id=rows[-1].pk)
                outcome.batches += 1
                outcome.messages += len(rows)
                continue
            router = router or _router(session)
            if provider is None:
                provider, model = embedder(tenant_id=session.tenant_id)
            try:
                answer = _ask(router, extraction.EXTRACT_PROMPT, extraction.transcript(lines),
                              max_output_tokens=EXTRACT_MAX_OUTPUT_TOKENS)
                candidates = extraction.parse_extraction(answer)
                ops = _plan(router=router, provider=provider, model=model, user_id=session.user_id,
                            agent_id=session.agent_id, candidates=candidates) if candidates else []
            except MalformedAnswer as exc:
                outcome.error = f"malformed answer: {exc}"
                last = state.failures + 1 >= MAX_MALFORMED_ATTEMPTS
                _failed(state=state, error=outcome.error, skip_to=rows[-1].pk if last else None)
                if not last:
                    break
                outcome.batches += 1
                continue
            except (LLMError, _embedding_error()) as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
                _failed(state=state, error=outcome.error, skip_to=None)
                break
            with transaction.atomic():
                _apply(ops=ops, session=session, user_id=session.user_id, agent_id=session.agent_id, model=model,
                       outcome=outcome)
                _advance(state=state, last_message_id=rows[-1].pk)
            outcome.batches += 1
            outcome.messages += len(rows)
    finally:
        MemoryExtraction.objects.filter(pk=state.pk).update(lease_until=None)
    return outcome


def _embedding_error() -> type[Exception]:
    from llm.embeddings import EmbeddingError

    return EmbeddingError
