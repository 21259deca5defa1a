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
tool's result is (:func:`sessions.runner.tool_execution.frame_untrusted`).
Runs whose bindings have no such kind cost nothing here (no database round trip).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Sequence
from typing import Any

from capabilities.registry import ContextBlock, OpenContext, kinds
from sessions.models import Run
from sessions.runner._db import db
from sessions.runner.spec import RunSpec
from sessions.runner.tool_execution import frame_untrusted

__all__ = ["context_system_text", "run_context_open"]

logger = logging.getLogger(__name__)


async def run_context_open(spec: RunSpec, ctx: OpenContext | None) -> tuple[ContextBlock, ...]:
    """The run's start context: stored blocks if the run already started once, else the
    blocks its bound kinds return now (then stored).

    Args:
        spec: The run (a sub-run has no bindings, hence no context of its own).
        ctx: The OpenContext its toolset was opened with (kinds may keep per-run state in
            ``ctx.extra`` between ``open_toolset`` and ``run_context``); None when the run has
            no bindings.

    Returns:
        The blocks, in the kinds' order (by position). A kind that raises is logged and left
        out; the run goes on.
    """
    producers = [(kind, spec.bindings_of(kind.key)) for kind in kinds() if kind.has_run_context()]
    producers = [(kind, specs) for kind, specs in producers if specs]
    if not producers or ctx is None or spec.depth > 0:
        return ()
    stored, query = await db(_context_load)(spec.run_id)
    if stored is not None:
        blocks = tuple(ContextBlock.from_json(b) for b in stored if isinstance(b, dict))
        ctx.extra["run_context"] = blocks  # kinds may read what the run was given (e.g. citation numbers)
        return blocks
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
    await db(_context_save)(spec.run_id, [b.as_json() for b in blocks])
    ctx.extra["run_context"] = tuple(blocks)
    return tuple(blocks)


def _context_load(run_id: int) -> tuple[list[Any] | None, str]:
    """``(Run.context, Run.input)`` of run ``run_id`` (on the run's DB thread, tenant-scoped)."""
    row = Run.objects.filter(pk=run_id).values_list("context", "input").first()
    if row is None:
        return [], ""
    return row[0], row[1]


def _context_save(run_id: int, blocks: list[dict[str, Any]]) -> None:
    """Store ``blocks`` as the run's context unless an earlier attempt already did."""
    Run.objects.filter(pk=run_id, context__isnull=True).update(context=blocks)


def context_nonce(run_id: int) -> str:
    """The nonce framing run ``run_id``'s untrusted start-context blocks: 16 hex characters,
    HMAC-SHA256 of the run id under ``settings.SECRET_KEY`` (64 bits, as
    :func:`~sessions.runner.tool_execution.frame_untrusted`'s random ones).

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

    An ``untrusted`` block's text is framed (:func:`~sessions.runner.tool_execution.frame_untrusted`:
    between ``<untrusted-data nonce="…">`` markers, forged markers inside defused); its title,
    the platform's own words, stays outside. ``nonce``: the run's (:func:`context_nonce`, so the
    system message, and a provider's prompt cache, stays the same from turn to turn and across a
    resume); None: a fresh one.
    """
    def body(block: ContextBlock) -> str:
        return frame_untrusted(block.text, nonce=nonce) if block.untrusted else block.text

    return "\n\n".join(f"{b.title}\n{body(b)}" if b.title else body(b) for b in blocks)
