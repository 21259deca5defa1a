"""Rerankers for :func:`knowledge.retrieval.search`: a rerank model, or an LLM as a relevance judge.

A reranker is any ``rerank(query, passages) -> scores`` callable
(:data:`knowledge.retrieval.Reranker`):

- :func:`model_reranker`: a **rerank model** (a cross-encoder such as bge-reranker, Jina's or
  Cohere's) behind a tenant's model provider, through the ``/v1/rerank`` API
  (:func:`llm.embeddings.arerank`). One request per search; the scores are the model's.

The others are made from a sync ``complete(prompt) -> text`` function over a chat model:

- :func:`llm_reranker`, **pointwise**: each passage judged on its own ("how well does this
  passage answer the question, 0–10?"), as in pointwise LLM relevance grading (Liang et al.,
  "Holistic Evaluation of Language Models", 2022). One model call per passage: with the
  embedded 0.5B model on two cores, ten passages take ~10–30 s.
- :func:`listwise_reranker`, **listwise**: one call sees the question and all the passages,
  numbered, and answers with their order (``[3] > [1] > …``), the prompt of RankGPT (Sun et
  al., "Is ChatGPT Good at Search? Investigating Large Language Models as Re-Ranking Agents",
  EMNLP 2023). One model call per search, whatever the number of passages (their text is
  shortened to :data:`LISTWISE_PASSAGE_CHARS` each to bound the prompt). Passages the answer
  leaves out keep their fused order after the ones it names. Measured with the embedded
  Qwen2.5-Coder-0.5B (bench/knowledge_quality.py): ten passages are ~1,500 prompt tokens,
  ~27 s a search on two busy cores, and the model answers ``[1] > [2]`` (the given order), so
  the fused order stays: the step needs a capable model to change anything.

:func:`route_reranker` binds either to a tenant's model route (the router's fallback and
retries apply); its calls are LLM calls of purpose ``rerank`` (:mod:`llm.metering`), counted
in usage and in the tenant's monthly budget. A pointwise answer without a number scores 0; an
error of the model is a :class:`~knowledge.retrieval.SearchError` (``rerank_failed``, the
caller decides whether a search without rerank is acceptable); a spent monthly budget is a
``SearchError`` (``budget_exceeded``) before any call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from knowledge.retrieval import Reranker, SearchError

RERANK_PROMPT = (
    "You judge search results. Question:\n{query}\n\nPassage:\n{passage}\n\n"
    "How well does the passage answer the question? Reply with one integer from 0 (unrelated) "
    "to 10 (answers it directly), and nothing else."
)
MAX_PASSAGE_CHARS = 1_500
RERANK_MAX_OUTPUT_TOKENS = 4

LISTWISE_PROMPT_HEAD = (
    "I will provide you with {count} passages, each indicated by a numerical identifier []. "
    "Rank the passages based on their relevance to the search query: {query}\n\n"
)
LISTWISE_PROMPT_TAIL = (
    "\nSearch query: {query}\n\nRank the {count} passages above based on their relevance to the search "
    "query. All the passages should be included and listed using identifiers, in descending order of "
    "relevance. The output format should be [] > [], e.g., [2] > [1]. Only respond with the ranking "
    "results, do not say any word or explain."
)
"""RankGPT's listwise prompt (Sun et al. 2023), the passages between head and tail as ``[n] text``."""
LISTWISE_PASSAGE_CHARS = 600
"""Characters of each passage in the listwise prompt (a chunk is ~500 with its heading path)."""
LISTWISE_MAX_OUTPUT_TOKENS = 80
"""Enough for ``[n] > `` twenty times."""


def parse_score(text: str) -> float:
    """The first integer 0–10 in a model's answer (clamped), else 0."""
    match = re.search(r"\d+", text or "")
    return float(min(10, int(match.group()))) if match else 0.0


def llm_reranker(complete: Callable[[str], str], *, prompt: str = RERANK_PROMPT) -> Reranker:
    """A reranker that asks ``complete`` for a 0–10 relevance grade per passage.

    Args:
        complete: Sync ``prompt -> answer text`` (one model call).
        prompt: A template with ``{query}`` and ``{passage}``.

    Returns:
        ``rerank(query, passages) -> [score 0–10 per passage]`` (len(passages) model calls).
    """

    def rerank(query: str, passages: Sequence[str]) -> list[float]:
        return [parse_score(complete(prompt.format(query=query, passage=p[:MAX_PASSAGE_CHARS]))) for p in passages]

    return rerank


def listwise_prompt(query: str, passages: Sequence[str]) -> str:
    """The listwise prompt for ``passages`` (numbered from 1, each shortened to
    :data:`LISTWISE_PASSAGE_CHARS`, whitespace collapsed)."""
    lines = [f"[{i}] {' '.join(p.split())[:LISTWISE_PASSAGE_CHARS]}" for i, p in enumerate(passages, start=1)]
    return (LISTWISE_PROMPT_HEAD.format(count=len(passages), query=query) + "\n".join(lines)
            + LISTWISE_PROMPT_TAIL.format(count=len(passages), query=query))


def parse_ranking(text: str, count: int) -> list[int]:
    """0-based passage indexes in the order the answer names them (``[3] > [1]`` or ``3, 1``),
    each once, out-of-range numbers ignored; passages it does not name follow in their given
    order. Always a permutation of ``range(count)``."""
    named = re.findall(r"\[(\d+)\]", text or "") or re.findall(r"\d+", text or "")
    order: list[int] = []
    for number in named:
        index = int(number) - 1
        if 0 <= index < count and index not in order:
            order.append(index)
    return order + [i for i in range(count) if i not in order]


def listwise_reranker(complete: Callable[[str], str]) -> Reranker:
    """A reranker that asks ``complete`` once for the order of all the passages.

    Args:
        complete: Sync ``prompt -> answer text`` (one model call per search).

    Returns:
        ``rerank(query, passages) -> scores``: ``len(passages) - position`` in the model's
        order (the first named scores highest), so the hits sort into that order.
    """

    def rerank(query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        order = parse_ranking(complete(listwise_prompt(query, passages)), len(passages))
        scores = [0.0] * len(passages)
        for position, index in enumerate(order):
            scores[index] = float(len(passages) - position)
        return scores

    return rerank


def route_reranker(
    *, route: Any, tenant: Any, listwise: bool = False, user_id: int | None = None, agent_id: int | None = None,
) -> Reranker:
    """:func:`llm_reranker` (pointwise, at most 4 output tokens per judgement) or, with
    ``listwise``, :func:`listwise_reranker` (one call, at most
    :data:`LISTWISE_MAX_OUTPUT_TOKENS`) over a tenant's model route (``llm.ModelRoute``),
    temperature as the route entries set it. Each call's attempts are LLM calls of purpose
    ``rerank`` for ``user_id`` / ``agent_id`` (who searched; either may be None). Requires
    tenant scope to build (the route's entries and keys are read now) and to call (the
    budget check and the LLMCall rows); each call runs its own event loop, so call the
    reranker from a thread without one (:func:`knowledge.retrieval.asearch` does).

    The reranker raises :class:`~knowledge.retrieval.SearchError`: ``budget_exceeded`` when
    the tenant's monthly model budget is spent (no model call made), ``rerank_failed`` with
    the model layer's reason when the route fails.
    """
    from llm.errors import LLMError
    from llm.metering import BudgetExceeded, CallSite, LLMCallPurpose, MeteredRoute
    from llm.selectors import route_entries, route_entry_config
    from llm.types import ChatMessage

    entries = route_entries(route_id=route.pk)
    metered = MeteredRoute(
        [route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries)],
        CallSite(tenant_id=tenant.pk, purpose=LLMCallPurpose.RERANK, entry_ids=tuple(e.pk for e in entries),
                 agent_id=agent_id, user_id=user_id),
    )
    max_output_tokens = LISTWISE_MAX_OUTPUT_TOKENS if listwise else RERANK_MAX_OUTPUT_TOKENS

    def complete(prompt: str) -> str:
        try:
            completion = metered.complete_sync([ChatMessage(role="user", content=prompt)],
                                               max_output_tokens=max_output_tokens)
        except BudgetExceeded as exc:
            raise SearchError(f"Not reranked: {exc}", code="budget_exceeded") from exc
        except LLMError as exc:
            raise SearchError(f"Not reranked: the model route {route.name!r} failed: {exc}",
                              code="rerank_failed") from exc
        return completion.message.content or ""

    return listwise_reranker(complete) if listwise else llm_reranker(complete)


def model_reranker(*, provider: Any, model: str) -> Reranker:
    """A reranker over the rerank model ``model`` at ``provider`` (an OpenAI-compatible
    ``llm.ModelProvider`` of the searching tenant): one ``/v1/rerank`` request per search
    (:func:`llm.embeddings.rerank`), each passage shortened to :data:`MAX_PASSAGE_CHARS`.
    Requires tenant scope to build (the provider's key is decrypted now). Not an LLM call:
    like embeddings, rerank requests are not metered against the tenant's model budget.

    The reranker raises :class:`~knowledge.retrieval.SearchError` (``rerank_failed``, with
    the provider's reason, its key redacted) when the request fails.
    """
    from llm.embeddings import RerankError, embedding_endpoint
    from llm.embeddings import rerank as rerank_request

    endpoint = embedding_endpoint(provider)

    def rerank(query: str, passages: Sequence[str]) -> list[float]:
        try:
            return rerank_request(endpoint, model, query, [p[:MAX_PASSAGE_CHARS] for p in passages])
        except RerankError as exc:
            raise SearchError(f"Not reranked: {exc.message}", code="rerank_failed") from exc

    return rerank
