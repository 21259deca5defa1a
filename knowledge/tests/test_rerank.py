"""The listwise reranker: one model call orders all the passages; what the answer leaves out
or gets wrong keeps the fused order."""

from __future__ import annotations

import pytest

from knowledge.rerank import LISTWISE_PASSAGE_CHARS, listwise_prompt, listwise_reranker, parse_ranking
from tenants.scoping import tenant_scope

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@pytest.mark.parametrize(("answer", "order"), [
    ("[3] > [1] > [2]", [2, 0, 1]),
    ("[2] > [2] > [9] > [0]", [1, 0, 2]),  # repeats and out-of-range numbers ignored, the rest in order
    ("3, 1", [2, 0, 1]),  # no brackets: bare numbers
    ("I cannot rank these.", [0, 1, 2]),
    ("", [0, 1, 2]),
])
def test_an_answer_is_read_as_a_permutation(answer, order):
    assert parse_ranking(answer, 3) == order


def test_the_prompt_numbers_every_passage_and_bounds_its_length():
    long = "word " * 1000
    prompt = listwise_prompt("Which animals sleep in winter?", ["Bears  hibernate\nin dens.", long])
    assert "[1] Bears hibernate in dens." in prompt and "[2] word" in prompt
    assert prompt.count("Which animals sleep in winter?") == 2 and "2 passages" in prompt
    assert len(prompt) < 2 * LISTWISE_PASSAGE_CHARS + 1_000


def test_one_call_orders_all_the_passages():
    prompts = []

    def complete(prompt):
        prompts.append(prompt)
        return "[2] > [3]"

    scores = listwise_reranker(complete)("q", ["a", "b", "c", "d"])
    assert len(prompts) == 1
    assert scores == [2.0, 4.0, 3.0, 1.0]  # named first, then the others in their given order
    assert listwise_reranker(complete)("q", []) == [] and len(prompts) == 1


@pytest.mark.django_db(transaction=True)
def test_the_route_reranker_listwise_makes_one_model_call(world, fake_llm):
    from agents.tests.factories import agent_with_route
    from knowledge.rerank import route_reranker
    from llm.testing import Reply

    route = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url]).route
    fake_llm.script(Reply("[3] > [1] > [2]"))
    with tenant_scope(world.tenant.pk):
        rerank = route_reranker(route=route, tenant=world.tenant, listwise=True)
        scores = rerank("Which animals sleep in winter?", ["Birds migrate.", "Frogs freeze.", "Bears hibernate."])
    assert scores == [2.0, 1.0, 3.0]
    assert len(fake_llm.requests) == 1 and "[3] Bears hibernate." in str(fake_llm.requests[0])
