"""Rows and fake-model responders for the evaluation tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from agents.tests.factories import agent_with_route
from evaluation.models import Dataset, DatasetItem
from llm.models import ModelRouteEntry
from llm.testing import Reply, ToolCalls

JUDGE_MARK = "You grade an AI assistant's answer"


def agent_on(tenant, fake_llm, *, price_per_mtok: str | None = None, **fields):
    """An agent whose route is the fake model (optionally priced, USD per million tokens, in and out)."""
    agent = agent_with_route(tenant=tenant, base_urls=[fake_llm.base_url], **fields)
    if price_per_mtok is not None:
        ModelRouteEntry.all_tenants.filter(route_id=agent.route_id).update(
            input_price_per_mtok=Decimal(price_per_mtok), output_price_per_mtok=Decimal(price_per_mtok)
        )
    return agent


def dataset_with(tenant, items: list[dict[str, Any]], name: str = "docs qa") -> Dataset:
    dataset = Dataset.all_tenants.create(tenant=tenant, name=name)
    for item in items:
        DatasetItem.all_tenants.create(
            tenant=tenant,
            dataset=dataset,
            input=item["input"],
            expected=item.get("expected", {}),
            messages=item.get("messages", []),
        )
    return dataset


def last_user_text(body: Mapping[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    content = users[-1]["content"] if users else ""
    if isinstance(content, list):
        content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def answering(
    answers: Mapping[str, str],
    *,
    judge: str = '{"score": 1, "reason": "fine"}',
    usage: tuple[int, int] = (100, 20),
    tools: Mapping[str, tuple[str, dict]] | None = None,
    seen: list[str] | None = None,
) -> Callable[[dict[str, Any]], Any]:
    """A responder: the judge's requests get ``judge``; a question (the last user message) whose
    text contains a key of ``tools`` gets that tool call first (then, once the tool answered,
    its answer); else the answer whose key the question contains (else "I don't know")."""

    def respond(body: dict[str, Any]) -> Any:
        messages = body.get("messages", [])
        if messages and messages[0].get("role") == "system" and JUDGE_MARK in str(messages[0].get("content")):
            return Reply(judge, usage=usage)
        question = last_user_text(body)
        if seen is not None:
            seen.append(question)
        for key, (name, arguments) in (tools or {}).items():
            if key in question and not any(m.get("role") == "tool" for m in messages):
                return ToolCalls([(name, arguments)], usage=usage)
        text = next((a for q, a in answers.items() if q in question), "I don't know.")
        return Reply(text, usage=usage)

    return respond
