"""Platform attribution: an answer that cites none of its passages, matched to them afterwards.

A run's answer should cite the passages it was given as ``[n]`` (knowledge_search's result
and the start context ask for it), but small models (the embedded Qwen2.5-Coder-0.5B) almost
never do. When a run completes with an answer that names none of its passages' numbers, the
platform attributes the answer's sentences to those passages itself (post-hoc citation):

1. :func:`answer_sentences` splits the reply into sentences, with their character offsets in
   the reply (fenced code blocks and fragments shorter than :data:`MIN_SENTENCE_CHARS`
   characters or :data:`MIN_SENTENCE_WORDS` words are skipped);
2. each sentence is embedded with the embedding model of the passages' knowledge base (the
   model that made the stored chunk vectors, :mod:`llm.embeddings`);
3. its cosine with each given passage's stored vector (``knowledge.models.Chunk.embedding``,
   unit length, so the cosine is the dot product) is computed, and the best passage is
   attached when the cosine is at least :data:`ATTRIBUTION_THRESHOLD`;
4. a sentence still unattributed that quotes a passage's text verbatim in inline code (a
   command, a setting, a path: :func:`code_spans`) goes to the nearest such passage: a short
   sentence around a quoted command scores low against a long chunk (the demo's own answer,
   "run the `make run` command", was 0.461 against one version of the README's Quick start
   and below the threshold against the next), yet the quote says where it came from.

The reply's text is never changed: attributions are stored beside it (``Run.attributions``)
and the chat app shows them as markers visibly different from the model's own citations
("matched by the platform"). They say which given passage a sentence is closest to in
meaning, not that the passage supports it.

Entry point: :func:`attribute` (called by the ``knowledge`` kind's
:meth:`~capabilities.registry.CapabilityKind.run_completed` hook). No Django import at module
level: :func:`answer_sentences` is pure (bench/attribution_threshold.py uses it).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ATTRIBUTION_THRESHOLD = 0.45
"""The least cosine (sentence vector · stored chunk vector) for a sentence to be attributed to
a passage. Calibrated with the embedded all-MiniLM-L6-v2 by bench/attribution_threshold.py
(2026-11-26: 31 hand-restated answer sentences whose passage was among the 5 given, 1,539
answers to other questions and 480 filler/off-topic sentences against the same passages):
at 0.45, 77% of the restated sentences go to their passage (23% to another of the given
passages), 4.5% of the answers about something else in the same documentation are attributed
and no filler sentence is (best filler cosine 0.356). 0.50 attributes no more restated
sentences to the right passage (77%) and 2.4% of the unrelated answers, but missed the demo's
own answer: "To start the platform, you need to run the `make run` command." against the
README's Quick start chunk is 0.461 (a short sentence against a 500-character chunk; against
the chunk's best single sentence only 0.27, so matching sentence to sentence is worse); at 0.55
the right ones drop to 68%. Another embedding model needs its own figure."""
MIN_SENTENCE_CHARS = 20
"""Shorter fragments ("Yes.", "Here it is:") are not attributed."""
MIN_SENTENCE_WORDS = 4
MAX_SENTENCES = 40
"""At most this many sentences of one answer are embedded (the first ones)."""
MAX_SENTENCE_CHARS = 2_000
"""A longer "sentence" is cut to this many characters before it is embedded."""

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?(^[ \t]*\1[^\n]*$|\Z)", re.MULTILINE | re.DOTALL)
_BREAK = re.compile(r"(?<=[.!?…])(?<!e\.g\.)(?<!i\.e\.)[\"')\]]*\s+|\n\s*\n|\n(?=[ \t]*(?:[-*+•]|\d{1,3}[.)]|#{1,6})\s)")
_LEAD = re.compile(r"(?:[-*+•]|\d{1,3}[.)]|#{1,6}|>)\s+")
_CITATION = re.compile(r"\[(\d{1,4})\]")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
MIN_CODE_SPAN_CHARS = 4
"""A shorter inline-code quote (`id`, `-v`) is too common to say which passage it came from."""


def code_spans(sentence: str) -> list[str]:
    """The inline-code spans of ``sentence`` with at least :data:`MIN_CODE_SPAN_CHARS`
    characters that are not all punctuation, stripped: ``"run `make run` now"`` ->
    ``["make run"]``."""
    spans = (m.group(1).strip() for m in _CODE_SPAN.finditer(sentence))
    return [span for span in spans if len(span) >= MIN_CODE_SPAN_CHARS and any(c.isalnum() for c in span)]


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence of an answer: ``reply[start:end] == text`` (character offsets)."""

    start: int
    end: int
    text: str


def answer_sentences(reply: str) -> list[Sentence]:
    """The sentences of ``reply`` worth attributing, in order, at most :data:`MAX_SENTENCES`.

    Fenced code blocks (````` ``` ````` / ``~~~``) are skipped whole; the rest is split after
    ``.`` ``!`` ``?`` ``…`` followed by white space, at blank lines and before list items and
    headings; a leading list marker, heading ``#`` or quote ``>`` and surrounding white space
    are left out of the sentence's span. Fragments shorter than :data:`MIN_SENTENCE_CHARS`
    characters or :data:`MIN_SENTENCE_WORDS` words are dropped.
    """
    spans: list[tuple[int, int]] = []
    pos = 0
    for fence in _FENCE.finditer(reply):
        spans.append((pos, fence.start()))
        pos = fence.end()
    spans.append((pos, len(reply)))
    out: list[Sentence] = []
    for span_start, span_end in spans:
        start = span_start
        breaks = [m.end() for m in _BREAK.finditer(reply, span_start, span_end)] + [span_end]
        for end in breaks:
            sentence = _trimmed(reply, start, end)
            start = end
            if sentence is not None:
                out.append(sentence)
                if len(out) >= MAX_SENTENCES:
                    return out
    return out


def _trimmed(reply: str, start: int, end: int) -> Sentence | None:
    """``reply[start:end]`` without surrounding white space and a leading marker; None if too short."""
    while start < end and reply[start].isspace():
        start += 1
    while end > start and reply[end - 1].isspace():
        end -= 1
    lead = _LEAD.match(reply, start, end)
    if lead:
        start = lead.end()
    text = reply[start:end]
    if len(text) < MIN_SENTENCE_CHARS or len(text.split()) < MIN_SENTENCE_WORDS:
        return None
    return Sentence(start=start, end=end, text=text)


def cites_any(reply: str, numbers: Iterable[int]) -> bool:
    """Whether ``reply`` has a ``[n]`` marker naming one of ``numbers`` (the run's passages)."""
    wanted = set(numbers)
    return any(int(m.group(1)) in wanted for m in _CITATION.finditer(reply))


def passage_numbers(citations: Iterable[Any]) -> dict[int, int]:
    """``{chunk_id: n}`` of the well-formed ``{n, chunk_id, ...}`` dicts of ``citations`` (the
    first number of a chunk given twice)."""
    out: dict[int, int] = {}
    for c in citations:
        if not isinstance(c, dict):
            continue
        try:
            chunk_id, n = int(c["chunk_id"]), int(c["n"])
        except (KeyError, TypeError, ValueError):
            continue
        out.setdefault(chunk_id, n)
    return out


def best_passages(sentence_vectors: Sequence[Sequence[float]], passages: Sequence[tuple[int, Sequence[float]]],
                  *, threshold: float = ATTRIBUTION_THRESHOLD) -> list[tuple[int, float] | None]:
    """For each sentence vector, ``(chunk_id, cosine)`` of its nearest passage, or None when
    that cosine is below ``threshold`` (or there is no passage).

    Args:
        sentence_vectors: Unit-length vectors (one per sentence).
        passages: ``[(chunk_id, unit-length vector)]`` of the same length as the sentences'.
        threshold: The least cosine that attributes.
    """
    out: list[tuple[int, float] | None] = []
    for vector in sentence_vectors:
        best: tuple[int, float] | None = None
        for chunk_id, passage in passages:
            score = sum(a * b for a, b in zip(vector, passage, strict=True))
            if best is None or score > best[1]:
                best = (chunk_id, score)
        out.append(best if best is not None and best[1] >= threshold else None)
    return out


@dataclass(frozen=True, slots=True)
class _Group:
    """Given passages embedded by one model: how to embed sentences the same way."""

    endpoint: Any
    model: str
    passages: list[tuple[int, list[float]]]
    texts: dict[int, str]


InThread = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]


async def attribute(reply: str, citations: Iterable[Any], *, in_thread: InThread,
                    threshold: float = ATTRIBUTION_THRESHOLD) -> list[dict[str, Any]] | None:
    """The attributions of ``reply`` to the passages of ``citations`` it does not cite.

    Args:
        reply: The run's final answer.
        citations: The ``{n, chunk_id, ...}`` citations of every passage the run was given
            (its start context's and its knowledge_search calls').
        in_thread: Runs a synchronous ORM function on the run's database thread, under the
            run's tenant scope (``OpenContext.in_thread``).
        threshold: The least cosine that attributes (:data:`ATTRIBUTION_THRESHOLD`).

    Returns:
        None when there is nothing to attribute to (no passages) or the reply already cites
        one of them ("not attempted"); else ``[{sentence_start, sentence_end, n, chunk_id,
        score}]`` (offsets in ``reply``, ``score`` the cosine rounded to 4 places), in
        sentence order, possibly empty. Passages whose chunk is gone, or whose stored vector
        was made by another model than their knowledge base's current one, are left out.

    Raises:
        llm.embeddings.EmbeddingError: the embedding model failed (the caller logs it and
            stores nothing). Database errors likewise propagate.
    """
    numbers = passage_numbers(citations)
    if not numbers or cites_any(reply, numbers.values()):
        return None
    sentences = answer_sentences(reply)
    if not sentences:
        return []
    groups = await in_thread(_passage_groups)(chunk_ids=list(numbers))
    from llm.embeddings import aembed_texts

    texts = [s.text[:MAX_SENTENCE_CHARS] for s in sentences]
    found: list[tuple[int, float] | None] = [None] * len(sentences)
    for group in groups:
        vectors = await aembed_texts(group.endpoint, group.model, texts)
        for i, match in enumerate(best_passages(vectors, group.passages, threshold=threshold)):
            if match is not None and (found[i] is None or match[1] > found[i][1]):
                found[i] = match
        for i, sentence in enumerate(sentences):
            if found[i] is None:
                found[i] = _quoted_passage(code_spans(sentence.text), vectors[i], group)
    return [{"sentence_start": s.start, "sentence_end": s.end, "n": numbers[m[0]], "chunk_id": m[0],
             "score": round(m[1], 4)}
            for s, m in zip(sentences, found, strict=True) if m is not None]


def _quoted_passage(spans: list[str], vector: Sequence[float], group: _Group) -> tuple[int, float] | None:
    """``(chunk_id, cosine)`` of the nearest passage of ``group`` whose text holds one of
    ``spans`` verbatim, or None."""
    quoted = [(chunk_id, sum(a * b for a, b in zip(vector, passage, strict=True)))
              for chunk_id, passage in group.passages if any(span in group.texts[chunk_id] for span in spans)]
    return max(quoted, key=lambda match: match[1]) if quoted else None


def _passage_groups(*, chunk_ids: list[int]) -> list[_Group]:
    """The stored vectors of ``chunk_ids`` that their knowledge base's current model made,
    grouped by that model, each group with its resolved embedding endpoint (database and key
    decryption: on the run's thread, tenant-scoped)."""
    from knowledge.models import Chunk, KnowledgeBase
    from llm.embeddings import embedding_endpoint

    rows = list(Chunk.objects.filter(pk__in=chunk_ids).values_list("pk", "knowledge_base_id", "embedding",
                                                                    "embedding_fingerprint", "text"))
    kbs = {kb.pk: kb for kb in KnowledgeBase.objects.filter(pk__in={r[1] for r in rows})
           .select_related("embedding_provider", "embedding_provider__tenant")}
    by_model: dict[tuple[int, str], _Group] = {}
    for chunk_id, kb_id, vector, fingerprint, text in rows:
        kb = kbs.get(kb_id)
        if kb is None or vector is None or fingerprint != kb.embedding_fingerprint:
            continue
        key = (kb.embedding_provider_id, kb.embedding_model)
        group = by_model.get(key)
        if group is None:
            group = by_model[key] = _Group(endpoint=embedding_endpoint(kb.embedding_provider),
                                           model=kb.embedding_model, passages=[], texts={})
        group.passages.append((chunk_id, [float(x) for x in vector]))
        group.texts[chunk_id] = text
    return list(by_model.values())
