"""What the model is asked when memories are extracted and merged, and how its answers are read.

Two prompts, after mem0's two phases (Chhikara et al., "Mem0: Building Production-Ready AI
Agents with Scalable Long-Term Memory", arXiv:2504.19413, 2025; the prompts in
``mem0/configs/prompts.py``: ``FACT_RETRIEVAL_PROMPT`` and ``DEFAULT_UPDATE_MEMORY_PROMPT``):

1. **Extraction** (:data:`EXTRACT_PROMPT`): the transcript of new messages → durable facts and
   preferences about the user, as ``{"memories": [{"text", "category"}]}``.
2. **Merge decision** (:data:`DECIDE_PROMPT`), only for a candidate with similar existing
   memories (cosine similarity ≥ ``RELATED_SIMILARITY``, below ``DUPLICATE_SIMILARITY``):
   ``{"event": "ADD" | "UPDATE" | "DELETE" | "NONE", "id": ..., "text": ...}``. As in mem0,
   the model sees the existing memories under short local ids ("1", "2", ...) rather than
   database ids, so it cannot name a row it was not shown.

Unlike mem0, one decision is asked per candidate (small local models answer one question
more reliably than a batch), and ``DELETE`` means *replace*: the contradicted memory is
removed and the candidate stored in its place (mem0 deletes only).

Everything here is pure (no Django, no I/O). An answer that is not the strict JSON asked for
raises :class:`MalformedAnswer`; the caller records the failure and retries later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_MEMORY_CHARS = 300
"""Longest memory text kept (a memory is one sentence); longer candidates are refused."""
MAX_CANDIDATES = 10
"""Candidates taken from one extraction answer (the rest are dropped)."""

Category = Literal["fact", "preference"]
Event = Literal["ADD", "UPDATE", "DELETE", "NONE"]


class MalformedAnswer(ValueError):
    """The model's answer is not the JSON asked for; ``str(exc)`` says why (logged, not shown)."""


EXTRACT_PROMPT = """You keep a long-term memory about one user of an AI assistant.
Read the conversation below and write down the durable facts and preferences it reveals about the USER:
who they are (name, role, location, languages), what they work on, their stable preferences
(tone, format, tools, food, schedule), constraints (allergies, budgets, deadlines that last).

Rules:
- Only what the USER said about themselves or clearly confirmed. Nothing the assistant said about itself.
- Each memory is one short sentence in the third person ("Prefers answers in French.", "Works as a nurse in Lyon.").
- Leave out small talk, one-off requests, questions, and anything true only for this conversation.
- Leave out secrets (passwords, keys, card numbers).
- Write in the language the user writes in.
- category is "preference" for likes, dislikes and how they want things done; otherwise "fact".

Answer with JSON only, no prose and no code fence, exactly of this shape:
{"memories": [{"text": "<one sentence>", "category": "fact"}]}
With nothing worth remembering, answer {"memories": []}."""


DECIDE_PROMPT = """You maintain a long-term memory about one user. A new memory candidate was found;
some existing memories are similar. Decide what to do with the candidate:

- "ADD": it is new information; keep the existing memories as they are.
- "UPDATE": it refines or extends existing memory <id> (same subject, more or newer detail);
  give "text": the one merged sentence that replaces memory <id>.
- "DELETE": it contradicts existing memory <id> (the user changed their mind or the fact changed);
  memory <id> is removed and the candidate is kept instead.
- "NONE": it says nothing that memory <id> or another existing memory does not already say.

Answer with JSON only, no prose and no code fence, exactly of this shape:
{"event": "ADD" | "UPDATE" | "DELETE" | "NONE", "id": "<id of the existing memory, or null for ADD>", "text": "<merged sentence for UPDATE, else null>"}"""


class Candidate(BaseModel):
    """One memory the extraction answer proposes."""

    model_config = ConfigDict(extra="ignore", strict=True)

    text: str = Field(min_length=3, max_length=MAX_MEMORY_CHARS)
    category: Category = "fact"

    @field_validator("text", mode="before")
    @classmethod
    def _one_line(cls, value: object) -> object:
        return " ".join(value.split()) if isinstance(value, str) else value


class _ExtractionAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    memories: list[Candidate]


class Decision(BaseModel):
    """The model's merge decision for one candidate (ids are the local ids it was shown)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    event: Event
    id: str | None = None
    text: str | None = Field(default=None, max_length=MAX_MEMORY_CHARS)

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("event", mode="before")
    @classmethod
    def _event_upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _json_object(answer: str) -> dict:
    """The JSON object in ``answer`` (a bare object, or one inside a ```json fence).

    Raises:
        MalformedAnswer: no JSON object, or not an object.
    """
    text = answer.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedAnswer(f"not JSON ({exc.msg} at character {exc.pos}): {answer[:200]!r}") from None
    if not isinstance(value, dict):
        raise MalformedAnswer(f"a JSON {type(value).__name__}, not an object: {answer[:200]!r}")
    return value


def parse_extraction(answer: str) -> list[Candidate]:
    """The candidates of an extraction answer (see :data:`EXTRACT_PROMPT`).

    Returns:
        At most :data:`MAX_CANDIDATES` candidates, exact repeats (case-insensitive) dropped,
        in the answer's order.

    Raises:
        MalformedAnswer: not the JSON shape asked for (an item without text, a text longer than
        :data:`MAX_MEMORY_CHARS`, an unknown category, ...).
    """
    try:
        parsed = _ExtractionAnswer.model_validate(_json_object(answer))
    except ValidationError as exc:
        raise MalformedAnswer(f"unexpected shape: {_first_error(exc)}") from None
    seen: set[str] = set()
    out: list[Candidate] = []
    for candidate in parsed.memories:
        key = candidate.text.casefold()
        if key not in seen:
            seen.add(key)
            out.append(candidate)
    return out[:MAX_CANDIDATES]


def parse_decision(answer: str, *, shown_ids: Sequence[str]) -> Decision:
    """The merge decision in ``answer`` (see :data:`DECIDE_PROMPT`), checked against the ids shown.

    Args:
        answer: The model's text.
        shown_ids: The local ids of the existing memories the model was shown.

    Raises:
        MalformedAnswer: not the JSON asked for; UPDATE/DELETE/NONE without one of
        ``shown_ids``; UPDATE without a ``text``.
    """
    try:
        decision = Decision.model_validate(_json_object(answer))
    except ValidationError as exc:
        raise MalformedAnswer(f"unexpected shape: {_first_error(exc)}") from None
    if decision.event in ("UPDATE", "DELETE") and decision.id not in shown_ids:
        raise MalformedAnswer(f"{decision.event} names id {decision.id!r}, not one of {list(shown_ids)}")
    if decision.event == "UPDATE" and not (decision.text or "").strip():
        raise MalformedAnswer("UPDATE without the merged text")
    return decision


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "answer"
    return f"{where}: {err.get('msg', 'invalid')}"


@dataclass(frozen=True, slots=True)
class TranscriptLine:
    """One message of the conversation as the extractor reads it."""

    role: Literal["user", "assistant"]
    text: str


TRANSCRIPT_MESSAGE_CHARS = 2_000
"""A message longer than this is cut (with a marker) in the transcript."""


def transcript(lines: Sequence[TranscriptLine]) -> str:
    """The conversation as plain text (``USER: ...`` / ``ASSISTANT: ...``), long messages cut."""
    out = []
    for line in lines:
        text = line.text if len(line.text) <= TRANSCRIPT_MESSAGE_CHARS else line.text[:TRANSCRIPT_MESSAGE_CHARS] + " […]"
        out.append(f"{line.role.upper()}: {text}")
    return "\n".join(out)


def decision_request(candidate: Candidate, related: Sequence[tuple[str, str]]) -> str:
    """The user message of a merge decision: the existing memories (``[(local_id, text)]``)
    and the candidate, as JSON."""
    return json.dumps({
        "existing_memories": [{"id": local_id, "text": text} for local_id, text in related],
        "candidate": {"text": candidate.text, "category": candidate.category},
    }, ensure_ascii=False, indent=1)


def recall_text(texts: Sequence[str]) -> str:
    """The run-start block's body for the memories ``texts`` (most relevant first)."""
    return "What you know about this user (from earlier conversations; it may be out of date):\n" + "\n".join(
        f"- {t}" for t in texts
    )
