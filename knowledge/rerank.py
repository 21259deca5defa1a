"""Rerankers for :func:`knowledge.retrieval.search`: an LLM as a pointwise relevance judge.

A reranker is any ``rerank(query, passages) -> scores`` callable
(:data:`knowledge.retrieval.Reranker`). :func:`llm_reranker` makes one from a sync
``complete(prompt) -> text`` function: each passage is judged on its own ("how well does
this passage answer the question, 0–10?"), as in pointwise LLM relevance grading (Liang et
al., "Holistic Evaluation of Language Models", 2022; Sun et al., "Is ChatGPT Good at Search?",
EMNLP 2023, compare it with listwise prompting). :func:`route_reranker` binds it to a
tenant's model route (the router's fallback and retries apply). A passage whose answer has no
number scores 0; an error of the model propagates (the caller decides whether a search
without rerank is acceptable).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

from knowledge.retrieval import Reranker

RERANK_PROMPT = (
    "You judge search results. Question:\n{query}\n\nPassage:\n{passage}\n\n"
    "How well does the passage answer the question? Reply with one integer from 0 (unrelated) "
    "to 10 (answers it directly), and nothing else."
)
MAX_PASSAGE_CHARS = 1_500
RERANK_MAX_OUTPUT_TOKENS = 4


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


def route_reranker(*, route: Any, tenant: Any) -> Reranker:
    """:func:`llm_reranker` over a tenant's model route (``llm.ModelRoute``), temperature as
    the route entries set it, at most 4 output tokens per judgement. Requires tenant scope to
    build (the route's entries and keys are read now); each call runs its own event loop, so
    call the reranker from a thread without one (:func:`knowledge.retrieval.asearch` does).
    """
    from llm.router import Router
    from llm.selectors import route_entries, route_entry_config
    from llm.types import ChatMessage

    configs = [route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(route_entries(route_id=route.pk))]
    router = Router(configs)

    def complete(prompt: str) -> str:
        completion = asyncio.run(router.complete([ChatMessage(role="user", content=prompt)], [],
                                                 max_output_tokens=RERANK_MAX_OUTPUT_TOKENS))
        return completion.message.content or ""

    return llm_reranker(complete)
