"""Context compaction: summarize the oldest part of a conversation so the rest fits.

When the next prompt (estimated with ``llm.tokens``) exceeds ``max_input_tokens ×
BUDGET_RATIO`` of the route entry that answered last (the one that will most likely be
called: after a fallback to a smaller entry, that smaller window counts), or when a model
rejects the prompt as too long, the runner compacts before the model turn:

1. the history after the current cursor is cut into groups that must stay together (a user
   message; an answer; an assistant message with all its tool results), so a tool call and
   its result are never split;
2. all but the last few groups are rendered as a transcript, with old tool results masked
   (observation masking: only the last :data:`UNMASKED_TOOL_RESULTS` results are shown, each
   capped), and the previous summary in front;
3. the route's model writes a summary with fixed sections (:data:`SUMMARY_SECTIONS`); its LLM
   calls are the run's, of purpose ``compaction`` (the caller, ``turn._compact``, says so);
4. a Compaction row records it and moves the cursor; the next prompt is the system prompt +
   summary + the groups kept.

Before each attempt the caller holds the run's budgets (per run, the tenant's month) against
the summary request's estimated prompt (:func:`summary_prompt_tokens`): a run that cannot
afford it fails ``budget_exceeded`` without calling the summarizer.

At most :data:`MAX_ATTEMPTS_PER_TURN` attempts per model turn, each keeping fewer groups
(:data:`KEEP_GROUPS_BY_ATTEMPT`); a summarizer that fails them all fails the run
(``compaction_failed``). Nothing here loops: every attempt is counted by the caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from llm.errors import LLMError, public_error_message
from llm.router import Router
from llm.tokens import estimate_text_tokens, estimate_tokens
from llm.types import ChatMessage, ToolCallRequest
from sessions.models import Message, MessageRole
from sessions.runner.database import History
from sessions.runner.ports import RunStore
from sessions.runner.spec import RunSpec

BUDGET_RATIO = 0.7
"""Compact when the prompt passes this share of the entry's ``max_input_tokens`` (DESIGN §6)."""
MAX_ATTEMPTS_PER_TURN = 3
KEEP_GROUPS_BY_ATTEMPT = (4, 2, 1)
"""Groups kept verbatim after the cursor, by attempt (fewer each time; at least one group is
always kept, and at least one is summarized when there are two or more)."""
UNMASKED_TOOL_RESULTS = 3
"""Tool results shown to the summarizer; older ones become one-line stubs."""
RESULT_CHARS = 2_000
"""A tool result shown to the summarizer is cut to this many characters."""
SUMMARY_MAX_OUTPUT_TOKENS = 1_024
SUMMARY_SECTIONS = ("Goal", "Progress", "Decisions", "Next steps", "Key context")
SUMMARY_HEADER = "\n\n# Summary of the conversation so far\n\n"

SUMMARIZER_PROMPT = (
    "You compress the history of a conversation between a user and an AI agent that uses tools, "
    "so the agent can continue the work with only your summary and the latest messages. "
    "Write in the conversation's language, in these sections, each a few short bullet points:\n"
    + "\n".join(f"## {s}" for s in SUMMARY_SECTIONS)
    + "\nKeep every fact the agent still needs: names, numbers, identifiers, paths, URLs, results of "
    "tool calls that matter, what the user asked for and decided. Drop chatter. Do not invent anything."
)

Publish = Callable[[str, dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class CompactionResult:
    ok: bool
    nothing_to_compact: bool = False
    error: str = ""
    tokens_after: int = 0


def groups(rows: list[Message]) -> list[list[Message]]:
    """The rows cut where the history may be cut: tool results stay with their call."""
    out: list[list[Message]] = []
    for row in rows:
        if row.role == MessageRole.TOOL and out and out[-1][0].role == MessageRole.ASSISTANT and out[-1][0].tool_calls:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def _as_chat(rows: list[Message]) -> list[ChatMessage]:
    out = []
    for m in rows:
        if m.role == MessageRole.ASSISTANT:
            calls = tuple(ToolCallRequest(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in m.tool_calls)
            out.append(ChatMessage(role="assistant", content=m.content, tool_calls=calls))
        elif m.role == MessageRole.TOOL:
            out.append(ChatMessage(role="tool", content=m.content, tool_call_id=m.tool_call_id, name=m.name))
        else:
            out.append(ChatMessage(role="user", content=m.content))
    return out


def transcript(rows: list[Message], *, previous_summary: str) -> str:
    """The part to summarize as plain text, old tool results masked."""
    tool_rows = [m for m in rows if m.role == MessageRole.TOOL]
    shown = {m.pk for m in tool_rows[-UNMASKED_TOOL_RESULTS:]}
    lines = []
    if previous_summary:
        lines += ["EARLIER SUMMARY:", previous_summary, ""]
    for m in rows:
        if m.role == MessageRole.USER:
            lines.append(f"USER: {m.content}")
        elif m.role == MessageRole.ASSISTANT:
            if m.content:
                lines.append(f"ASSISTANT: {m.content}")
            for call in m.tool_calls:
                lines.append(f"TOOL CALL {call['name']}({call['arguments']})")
        elif m.pk in shown:
            text = m.content if len(m.content) <= RESULT_CHARS else m.content[:RESULT_CHARS] + " […]"
            lines.append(f"TOOL RESULT {m.name}: {text}")
        else:
            lines.append(f"TOOL RESULT {m.name}: [{len(m.content)} characters, omitted]")
    return "\n".join(lines)


def _summarized_rows(history: History, attempt: int) -> list[Message] | None:
    """The rows attempt ``attempt`` (1-based) summarizes: all but the last groups it keeps
    verbatim (:data:`KEEP_GROUPS_BY_ATTEMPT`), or None when fewer than two groups are left."""
    parts = groups(history.rows)
    keep = min(KEEP_GROUPS_BY_ATTEMPT[min(attempt, len(KEEP_GROUPS_BY_ATTEMPT)) - 1], len(parts) - 1)
    if keep < 1:  # the last group is never summarized: the model must see where it stands
        return None
    return [m for g in parts[:-keep] for m in g]


def _summary_messages(history: History, summarized: list[Message]) -> list[ChatMessage]:
    """The summarizer's request: its instructions and the transcript of ``summarized``."""
    return [ChatMessage(role="system", content=SUMMARIZER_PROMPT),
            ChatMessage(role="user", content=transcript(summarized, previous_summary=history.summary))]


def summary_prompt_tokens(history: History, *, attempt: int) -> int | None:
    """The estimated prompt tokens (``llm.tokens.estimate_tokens``, no tools) of the summary
    request that compaction attempt ``attempt`` (1-based) would send for ``history``: the very
    messages :func:`compact` builds. None when that attempt would have nothing to compact
    (it then makes no model call). Reads nothing but ``history``."""
    summarized = _summarized_rows(history, attempt)
    if summarized is None:
        return None
    return estimate_tokens(_summary_messages(history, summarized), [])


async def compact(
    *, spec: RunSpec, history: History, router: Router, publish: Publish, store: RunStore, attempt: int,
    tokens_before: int,
) -> CompactionResult:
    """One compaction attempt (see the module docstring).

    Returns:
        ``ok`` with the estimated prompt tokens after, or why not: ``nothing_to_compact``
        (too few groups left), or the summarizer's error. Every attempt that calls the
        summarizer goes through the store: ``compaction_begin`` (``compaction_running``)
        before, ``compaction_save`` (its Compaction row, then ``compaction_completed``) after.
    """
    summarized = _summarized_rows(history, attempt)
    if summarized is None:
        return CompactionResult(ok=False, nothing_to_compact=True, error="nothing left to compact")
    await store.compaction_begin(attempt=attempt, tokens_before=tokens_before, messages=len(summarized),
                                 publish=publish)  # compaction_running
    try:
        completion = await router.complete(
            _summary_messages(history, summarized), [], max_output_tokens=SUMMARY_MAX_OUTPUT_TOKENS,
        )
        summary = completion.message.content.strip()
        if not summary:
            raise ValueError("the summarizer returned an empty summary")
    except (LLMError, ValueError) as exc:
        error_class = getattr(exc, "error_class", None)
        # Members read this (the event, the run's error): a provider's text stays out of it.
        error = (f"{type(exc).__name__}: {public_error_message(error_class)} ({error_class})" if error_class
                 else f"{type(exc).__name__}: {exc}")
        await store.compaction_save(  # compaction_completed {ok: false}
            spec=spec, attempt=attempt, status="failed", tokens_before=tokens_before, error=error, publish=publish,
        )
        return CompactionResult(ok=False, error=error)
    tokens_after = (
        tokens_before - estimate_tokens(_as_chat(summarized), []) + estimate_text_tokens(summary)
        - (estimate_text_tokens(history.summary) if history.summary else 0)
    )
    await store.compaction_save(  # compaction_completed {ok: true}
        spec=spec, attempt=attempt, status="succeeded", summary=summary, cursor_message_id=summarized[-1].pk,
        messages_summarized=len(summarized), tokens_before=tokens_before, tokens_after=max(tokens_after, 0),
        publish=publish,
    )
    return CompactionResult(ok=True, tokens_after=max(tokens_after, 0))


def system_prompt_with_summary(system_prompt: str, summary: str) -> str:
    return system_prompt + SUMMARY_HEADER + summary if summary else system_prompt


__all__ = ["BUDGET_RATIO", "MAX_ATTEMPTS_PER_TURN", "CompactionResult", "compact", "groups", "transcript",
           "summary_prompt_tokens", "system_prompt_with_summary"]
