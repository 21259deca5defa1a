"""The two scorers that call something: semantic similarity with the tenant's embedder (a fake
embeddings server) and the LLM judge through a route (the fake model), metered as LLM calls of
purpose ``evaluation``."""

from __future__ import annotations

import pytest

from agents.tests.factories import agent_with_route
from evaluation.scoring import ScoringInput, result_score
from knowledge.tests import builders as kb_builders
from knowledge.tests.fake_embedder import running
from llm.testing import Fail, Reply
from sessions.models import LLMCall
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

REFERENCE = "The embeddings server listens on port 8082 on the local host."


def _input(world, output, **fields):
    return ScoringInput(
        tenant_id=world.tenant.pk, question="Which port?", output=output, expected={"reference": REFERENCE}, **fields
    )


def test_semantic_similarity_with_the_tenants_embedder(world):
    semantic = [{"type": "semantic", "threshold": 0.8}]
    with tenant_scope(world.tenant.pk):
        skipped = result_score(semantic, _input(world, REFERENCE)).scores["semantic"]
    assert skipped == {
        "skipped": "no embedder configured: the tenant has no shared knowledge base (or name provider and model)"
    }
    with running() as embedder:
        kb_builders.knowledge_base(world.tenant, base_url=embedder.base_url)
        with tenant_scope(world.tenant.pk):
            close = result_score(semantic, _input(world, "The embeddings server listens on port 8082 locally."))
            far = result_score(semantic, _input(world, "Bananas are yellow and rich in potassium."))
    assert close.scores["semantic"]["passed"] and close.scores["semantic"]["score"] > 0.8
    assert not far.scores["semantic"]["passed"] and far.scores["semantic"]["score"] < 0.5
    assert close.passed and not far.passed


def test_the_judge_is_metered_as_evaluation_and_its_failure_is_a_zero(world, fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
    judge = [{"type": "llm_judge", "route": agent.route_id, "rubric": "Names the port.", "threshold": 0.5}]
    fake_llm.script(Reply('{"score": 0.25, "reason": "no port"}', usage=(300, 10)), Fail(400))
    with tenant_scope(world.tenant.pk):
        low = result_score(judge, _input(world, "It listens somewhere.", agent_id=agent.pk, user_id=world.admin.pk))
        failed = result_score(judge, _input(world, "Port 8082."))
    assert low.scores["llm_judge"] == {"score": 0.25, "passed": False, "detail": "no port"}
    assert (low.prompt_tokens, low.completion_tokens) == (300, 10)
    assert failed.scores["llm_judge"]["score"] == 0 and "route failed" in failed.scores["llm_judge"]["detail"]
    rubric_request = fake_llm.requests[0]["messages"][1]["content"]
    assert "Names the port." in rubric_request and REFERENCE in rubric_request
    calls = LLMCall.all_tenants.filter(tenant=world.tenant).order_by("pk")
    assert [(c.purpose, c.run_id, c.agent_id) for c in calls] == [
        ("evaluation", None, agent.pk),
        ("evaluation", None, None),
    ]
