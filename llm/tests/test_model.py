"""The model protocol (llm.model): adapters and the fallback router are Models, settings reach
the provider, and the first-token hook reaches the caller."""

from __future__ import annotations

import pytest

from llm.model import DEFAULT_SETTINGS, Model, ModelSettings
from llm.providers import UnavailableModel, model_for
from llm.providers.anthropic import AnthropicModel
from llm.providers.openai_compat import OpenAICompatModel
from llm.router import FallbackModel, Router
from llm.testing import Fail, FakeLLMServer, Reply
from llm.tests.test_router import USER, entry, text_of
from llm.types import Completion

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def test_adapters_and_the_router_implement_the_protocol() -> None:
    openai_entry = entry(0, "http://x/v1")
    anthropic_entry = entry(0, "https://api.anthropic.com", api="anthropic")
    assert Router is FallbackModel
    assert isinstance(model_for(openai_entry), OpenAICompatModel)
    assert isinstance(model_for(anthropic_entry), AnthropicModel)
    for model in (model_for(openai_entry), model_for(anthropic_entry), Router([openai_entry]),
                  UnavailableModel(openai_entry, "no")):
        assert isinstance(model, Model)


async def test_an_adapter_streams_its_entry_with_the_call_settings(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("adapter answer"))
    model = OpenAICompatModel(entry(0, server_a.base_url, temperature=0.2))

    events = [e async for e in model.stream(USER, [], ModelSettings(max_output_tokens=7, temperature=1.5))]

    assert text_of(events) == "adapter answer" and isinstance(events[-1], Completion)
    assert server_a.requests[0]["max_tokens"] == 7
    assert server_a.requests[0]["temperature"] == 1.5  # the call's, not the entry's 0.2


async def test_the_router_passes_the_settings_to_the_entry_that_answers(server_a, server_b) -> None:
    server_a.script(Fail(500))
    server_b.script(Reply("from b"))
    router = Router([entry(0, server_a.base_url, max_retries=0), entry(1, server_b.base_url, temperature=0.3)])

    completion = await router.complete(USER, [], ModelSettings(max_output_tokens=9, temperature=0.0))

    assert completion.message.content == "from b"
    assert server_b.requests[0]["max_tokens"] == 9 and server_b.requests[0]["temperature"] == 0.0


async def test_without_settings_the_entry_keeps_its_own_temperature(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("x"))
    await Router([entry(0, server_a.base_url, temperature=0.4)]).complete(USER, [])
    assert server_a.requests[0]["temperature"] == 0.4 and server_a.requests[0]["max_tokens"] == 1024


async def test_settings_and_a_keyword_shortcut_together_are_refused(server_a: FakeLLMServer) -> None:
    stream = Router([entry(0, server_a.base_url)]).stream(USER, [], DEFAULT_SETTINGS, max_output_tokens=5)
    with pytest.raises(TypeError):
        await anext(stream)
    assert server_a.requests == []


async def test_the_first_token_hook_fires_once_for_the_attempt_that_answers(server_a, server_b) -> None:
    server_a.script(Fail(503))
    server_b.script(Reply("several chunks of an answer", chunk_size=4))
    fired: list[int] = []
    router = Router([entry(0, server_a.base_url, max_retries=0), entry(1, server_b.base_url)])

    events = [e async for e in router.stream(USER, [], on_first_token=lambda: fired.append(len(server_b.requests)))]

    assert text_of(events) == "several chunks of an answer"
    assert fired == [1]  # once, during entry 1's attempt (the failed entry 0 streamed nothing)


def test_model_settings_are_checked() -> None:
    for bad in ({"max_output_tokens": -1}, {"max_output_tokens": True}, {"temperature": 2.5}, {"temperature": "hot"}):
        with pytest.raises(ValueError):
            ModelSettings(**bad)
    assert ModelSettings().applied_to(e := entry(0, "http://x/v1")) is e
