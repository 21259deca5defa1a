"""Scoring one result: the model-free scorers of :mod:`evaluation.scorers`, plus the two that
call a model, in the experiment's tenant scope (blocking: a Celery task's thread).

- ``semantic``: the answer and the reference embedded by the tenant's embedder (the scorer's
  ``provider`` id and ``model`` if given, else those of the tenant's most recently changed
  shared knowledge base: :func:`tenant_embedder`); skipped, with the reason, when the tenant
  has none or the embedder fails.
- ``llm_judge``: the rubric, the question, the reference and the answer sent to the scorer's
  ``route``, metered as LLM calls of purpose ``evaluation`` (usage pages and the monthly
  budget count them); its cost is added to the result's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evaluation.scorers import Score, judge_verdict, score_text, semantic_similarity
from llm.metering import BudgetExceeded, CallSite, LLMCallPurpose, MeteredRoute

logger = logging.getLogger(__name__)

JUDGE_MAX_OUTPUT_TOKENS = 300
JUDGE_SYSTEM_PROMPT = (
    "You grade an AI assistant's answer against a rubric. Read the rubric, the question, the reference "
    "answer (it may be empty) and the answer to grade. Reply with only a JSON object: "
    '{"score": <a number from 0 (fails the rubric) to 1 (fully meets it)>, "reason": "<one sentence>"}.'
)


@dataclass
class ScoringInput:
    """What the scorers see of one result."""

    tenant_id: int
    question: str
    output: str
    expected: Mapping[str, Any]
    tool_calls: Sequence[Mapping[str, Any]] = ()
    agent_id: int | None = None
    user_id: int | None = None


@dataclass
class Scored:
    """The scores of one result: ``scores`` as stored (``{name: {score, passed, detail}}`` or
    ``{name: {skipped}}``), whether every applicable scorer passed, and the judge's cost."""

    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    cost_usd_micros: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def passed(self) -> bool:
        return all(s.get("passed", True) for s in self.scores.values())


class _CountingRoute(MeteredRoute):
    """A metered route that also sums the cost and tokens of its attempts (the judge's cost
    counts toward the experiment's cap)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cost_usd_micros = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _take(self) -> list[Any]:
        taken = super()._take()
        for attempt in taken:
            self.cost_usd_micros += attempt.cost_usd_micros or 0
            self.prompt_tokens += attempt.prompt_tokens or 0
            self.completion_tokens += attempt.completion_tokens or 0
        return taken


def tenant_embedder(tenant_id: int, config: Mapping[str, Any]) -> tuple[Any, str] | str:
    """``(provider, model)`` to embed with for the ``semantic`` scorer, or why there is none:
    the scorer's ``provider`` (a ModelProvider id of the tenant) and ``model``, else the
    embedding provider and model of the tenant's most recently changed shared knowledge base.
    Tenant scope required."""
    from knowledge.models import KnowledgeBase
    from llm.models import ModelProvider

    if config.get("provider"):
        provider = ModelProvider.objects.filter(pk=config["provider"]).first()
        if provider is None or not config.get("model"):
            return "the semantic scorer's provider is not the tenant's, or it names no model"
        return provider, str(config["model"])
    kb = (
        KnowledgeBase.objects.filter(owner__isnull=True)
        .select_related("embedding_provider")
        .order_by("-updated_at", "-id")
        .first()
    )
    if kb is None:
        return "no embedder configured: the tenant has no shared knowledge base (or name provider and model)"
    return kb.embedding_provider, kb.embedding_model


def _semantic(config: Mapping[str, Any], data: ScoringInput) -> dict[str, Any] | None:
    from llm.embeddings import EmbeddingError, embed_texts

    reference = data.expected.get("reference")
    if not reference:
        return None
    embedder = tenant_embedder(data.tenant_id, config)
    if isinstance(embedder, str):
        return {"skipped": embedder}
    provider, model = embedder
    try:
        output_vector, reference_vector = embed_texts(provider, model, [data.output or " ", reference])
    except EmbeddingError as exc:
        return {"skipped": f"the embedder failed: {exc}"}
    return semantic_similarity(output_vector, reference_vector, threshold=config["threshold"]).as_json()


def _judge_messages(config: Mapping[str, Any], data: ScoringInput) -> list[Any]:
    from llm.types import ChatMessage

    user = (
        f"Rubric:\n{config['rubric']}\n\nQuestion:\n{data.question}\n\n"
        f"Reference answer:\n{data.expected.get('reference', '')}\n\nAnswer to grade:\n{data.output}"
    )
    return [ChatMessage(role="system", content=JUDGE_SYSTEM_PROMPT), ChatMessage(role="user", content=user)]


def _judge(config: Mapping[str, Any], data: ScoringInput, scored: Scored) -> dict[str, Any]:
    from llm.errors import LLMError
    from llm.selectors import route_entries, route_entry_config
    from tenants.models import Tenant

    entries = route_entries(route_id=config["route"])
    if not entries:
        return {"skipped": "the judge's route has no entries (or is not the tenant's)"}
    tenant = Tenant.objects.get(pk=data.tenant_id)
    route = _CountingRoute(
        [route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries)],
        CallSite(
            tenant_id=data.tenant_id,
            purpose=LLMCallPurpose.EVALUATION,
            entry_ids=tuple(e.pk for e in entries),
            agent_id=data.agent_id,
            user_id=data.user_id,
        ),
    )
    try:
        answer = route.complete_sync(_judge_messages(config, data), max_output_tokens=JUDGE_MAX_OUTPUT_TOKENS)
        verdict: dict[str, Any] = judge_verdict(answer.message.content, threshold=config["threshold"]).as_json()
    except BudgetExceeded as exc:
        verdict = {"skipped": f"the judge was not asked: {exc}"}
    except LLMError as exc:
        verdict = Score(0.0, False, f"the judge's route failed: {exc}").as_json()
    scored.cost_usd_micros += route.cost_usd_micros
    scored.prompt_tokens += route.prompt_tokens
    scored.completion_tokens += route.completion_tokens
    return verdict


def result_score(scorers: Sequence[Mapping[str, Any]], data: ScoringInput) -> Scored:
    """Every scorer of the experiment on one answer (tenant scope required). A scorer with
    nothing to check for the item is left out of ``scores``; one that could not score is
    ``{skipped: reason}`` and does not decide ``passed``."""
    scored = Scored()
    for config in scorers:
        kind = config["type"]
        if kind == "semantic":
            result = _semantic(config, data)
        elif kind == "llm_judge":
            result = _judge(config, data, scored)
        else:
            score = score_text(config, data.output, data.expected, data.tool_calls)
            result = score.as_json() if score is not None else None
        if result is not None:
            scored.scores[kind] = result
    return scored
