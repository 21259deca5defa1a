"""A run's start context: the blocks its bound capability kinds add to the model input.

At a run's first start, every bound kind that overrides
:meth:`capabilities.registry.CapabilityKind.run_context` (knowledge bases retrieving before the
first turn, memory recalling what it knows about the user) is asked once, with the run's user
message as the query; the blocks are stored on the run (``Run.context``) before the first
model turn. A resumed run (after an approval, or a worker that died) reads the stored blocks
instead of asking again, so it sees the same context; the console's trace and the chat app
read them from there too.

:func:`context_system_text` is how the blocks reach the model: appended to the system
message, after the system prompt (and the compaction summary), one section per block; the
text of an ``untrusted`` block (retrieved passages) is framed as outside data, as an untrusted
tool's result is (:func:`capabilities.untrusted.frame_untrusted`).
Runs whose bindings have no such kind cost nothing here (no database round trip).

At a top-level run's completion, :func:`run_attributions` asks every bound kind that
overrides :meth:`~capabilities.registry.CapabilityKind.run_completed` (the knowledge kind:
an answer that cites none of its passages is matched to them, :mod:`knowledge.attribution`)
for attributions of the answer, within :data:`ATTRIBUTION_TIMEOUT_SECONDS`, and stores them
(``Run.attributions``) before the run ends, so that ``run_completed`` carries them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from capabilities.registry import CapabilityKind, ContextBlock, OpenContext, RunAnswer, ToolResultData, kinds
from capabilities.untrusted import frame_untrusted
from sessions.runner.spec import RunSpec

if TYPE_CHECKING:
    from sessions.runner.ports import RunStore
    from sessions.runner.toolset import Toolset

__all__ = ["ATTRIBUTION_TIMEOUT_SECONDS", "context_system_text", "run_attributions", "run_context_open"]

ATTRIBUTION_TIMEOUT_SECONDS = 2.0
"""The longest a completed run waits for its kinds' attributions (embedding the answer's
sentences) before it ends without them."""

logger = logging.getLogger(__name__)

Producers = list[tuple[CapabilityKind, tuple[Any, ...]]]
"""``[(kind, the run's binding specs of that kind)]``, in the kinds' order."""


def _producers(spec: RunSpec, *, context: bool) -> Producers:
    """The run's bound kinds that add a start context (``context``) or attribute answers (not ``context``)."""
    wanted = [kind for kind in kinds() if (kind.has_run_context() if context else kind.has_run_completed())]
    found = [(kind, spec.bindings_of(kind.key)) for kind in wanted]
    return [(kind, specs) for kind, specs in found if specs and (not context or kind.run_context_wanted(specs, spec))]


async def run_context_open(spec: RunSpec, ctx: OpenContext | None, *, store: RunStore) -> tuple[ContextBlock, ...]:
    """The run's start context: stored blocks if the run already started once, else the
    blocks its bound kinds return now (then stored).

    Args:
        spec: The run (a sub-run has no bindings, hence no context of its own).
        ctx: The OpenContext its toolset was opened with (kinds may keep per-run state in
            ``ctx.extra`` between ``open_toolset`` and ``run_context``); None when the run has
            no bindings.
        store: The run's store: the stored blocks and the run's input are read, and new blocks
            written, through it (``run_context_load`` / ``run_context_save``).

    Returns:
        The blocks, in the kinds' order (by position). A kind that raises is logged and left
        out; the run goes on.
    """
    producers = _producers(spec, context=True)
    if not producers or ctx is None or spec.depth > 0:
        return ()
    stored, query = await store.run_context_load(spec.run_id)
    if stored is not None:
        blocks = tuple(ContextBlock.from_json(b) for b in stored if isinstance(b, dict))
    else:
        blocks = await _context_made(spec, ctx, producers, query)
        await store.run_context_save(spec.run_id, [b.as_json() for b in blocks])
    ctx.extra["run_context"] = blocks  # kinds may read what the run was given (e.g. citation numbers)
    return blocks


async def _context_made(spec: RunSpec, ctx: OpenContext, producers: Producers, query: str) -> tuple[ContextBlock, ...]:
    """The blocks the kinds return now for ``query`` (the run's user message); a kind that raises is left out."""
    blocks: list[ContextBlock] = []
    for kind, specs in producers:
        try:
            made = await kind.run_context(specs, ctx, query)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a kind's context is an extra: the run goes on without it
            logger.warning("run %s: the %s kind's run context failed", spec.run_id, kind.key, exc_info=True)
            continue
        blocks.extend(b for b in made if isinstance(b, ContextBlock) and b.text.strip())
    return tuple(blocks)


async def run_attributions(spec: RunSpec, toolset: Toolset, context: Sequence[ContextBlock], reply: str, *,
                           store: RunStore, timeout: float | None = None) -> list[dict[str, Any]] | None:
    """The attributions of a completed run's ``reply`` by its bound kinds, stored on the run.

    Args:
        spec: The run (a sub-run gets none: None).
        toolset: Its toolset (``context``: the OpenContext the kinds opened their tools with;
            ``origins``: the exposed names' origins).
        context: The run's start context.
        reply: The answer.
        store: The run's store: the run's tool results are read, and the attributions written,
            through it (``tool_results`` / ``attributions_save``).
        timeout: The most this may take, in seconds (default :data:`ATTRIBUTION_TIMEOUT_SECONDS`).

    Returns:
        The kinds' attributions concatenated (each kind's in order), as stored in
        ``Run.attributions``; None (nothing stored) when no kind attempted one, or when it
        failed or ran out of time (logged; the run completes all the same).
    """
    ctx = toolset.context
    producers = _producers(spec, context=False)
    if not producers or ctx is None or spec.depth > 0 or not reply.strip():
        return None
    limit = ATTRIBUTION_TIMEOUT_SECONDS if timeout is None else timeout
    try:
        async with asyncio.timeout(limit):
            return await _attributed(spec, toolset, ctx, producers, context, reply, store)
    except TimeoutError:  # (a cancel of the run itself is a CancelledError: it goes through)
        logger.warning("run %s: attributing the answer took longer than %.1f s; the run completes without",
                       spec.run_id, limit)
    except Exception:  # noqa: BLE001 - attribution is an extra: the run completes without it
        logger.warning("run %s: attributing the answer failed", spec.run_id, exc_info=True)
    return None


async def _attributed(spec: RunSpec, toolset: Toolset, ctx: OpenContext, producers: Producers,
                      context: Sequence[ContextBlock], reply: str, store: RunStore) -> list[dict[str, Any]] | None:
    """:func:`run_attributions`' work, within its time limit: ask each kind, store what they made."""
    results = await store.tool_results(spec.run_id)
    origins = toolset.origins
    answer = RunAnswer(reply=reply, context=tuple(context), tool_results=tuple(
        ToolResultData(source=origins[name].source, name=origins[name].name, data=data)
        for name, data in results if name in origins))
    attributions: list[dict[str, Any]] | None = None
    for kind, specs in producers:
        made = await kind.run_completed(specs, ctx, answer)
        if made is not None:
            attributions = [*(attributions or []), *made]
    if attributions is not None:
        await store.attributions_save(spec.run_id, attributions)
    return attributions


def context_nonce(run_id: int) -> str:
    """The nonce framing run ``run_id``'s untrusted start-context blocks: 16 hex characters,
    HMAC-SHA256 of the run id under ``settings.SECRET_KEY`` (64 bits, as
    :func:`~capabilities.untrusted.frame_untrusted`'s random ones).

    The same for every turn and every attempt of the run, so a run resumed by another worker
    (after a crash or an approval) sends the same system message as before, and a provider's
    prompt cache still matches; not guessable by whoever wrote the passages (they would need
    the key), and different for every run.
    """
    from django.conf import settings

    digest = hmac.new(str(settings.SECRET_KEY).encode(), f"run-context-nonce:{int(run_id)}".encode(), hashlib.sha256)
    return digest.hexdigest()[:16]


def context_system_text(blocks: Sequence[ContextBlock], *, nonce: str | None = None) -> str:
    """The blocks as the text appended to the run's system message: ``"{title}\\n{text}"``
    per block, separated by blank lines ("" for none).

    An ``untrusted`` block's text is framed (:func:`~capabilities.untrusted.frame_untrusted`:
    between ``<untrusted-data nonce="…">`` markers, forged markers inside defused); its title,
    the platform's own words, stays outside. ``nonce``: the run's (:func:`context_nonce`, so the
    system message, and a provider's prompt cache, stays the same from turn to turn and across a
    resume); None: a fresh one.
    """
    def body(block: ContextBlock) -> str:
        return frame_untrusted(block.text, nonce=nonce) if block.untrusted else block.text

    return "\n\n".join(f"{b.title}\n{body(b)}" if b.title else body(b) for b in blocks)
