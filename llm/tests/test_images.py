"""Images in user messages (issue 25): each API's image part for an entry that
``supports_images``, the text alone for one that does not, and a fallback between the two.

Against real fake servers (FakeLLMServer, FakeAnthropicServer): the assertions read the JSON
request each server received.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from llm.config import RouteEntryConfig
from llm.router import Router
from llm.testing import Fail, FakeLLMServer, Reply
from llm.testing_anthropic import FakeAnthropicServer
from llm.tokens import IMAGE_TOKENS, estimate_message_tokens
from llm.types import ChatMessage, Completion, ImagePart

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x01" * 16).decode()
TEXT = '[image: artifact:7 "cat.png", image/png, 40 B]\n[image: artifact:8 "dog.jpg", image/jpeg, 20 B]\n\nWhat is this?'
MESSAGES = [
    ChatMessage(role="system", content="You are terse."),
    ChatMessage(role="user", content=TEXT,
                images=(ImagePart(mime_type="image/png", data=PNG), ImagePart(mime_type="image/jpeg", data=JPEG))),
]


def entry(index: int, base_url: str, **overrides: Any) -> RouteEntryConfig:
    values: dict[str, Any] = {
        "index": index, "provider_name": f"p{index}", "base_url": base_url, "api_key": f"k{index}",
        "model": f"model-{index}", "max_input_tokens": 100_000, "max_output_tokens": 256,
        "connect_timeout_seconds": 2.0, "read_timeout_seconds": 5.0, "max_retries": 0,
    }
    values.update(overrides)
    return RouteEntryConfig(**values)


async def answer(router: Router) -> Completion:
    return await router.complete(MESSAGES, [])


OPENAI_PARTS = [
    {"type": "text", "text": TEXT},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
]
ANTHROPIC_BLOCKS = [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": JPEG}},
    {"type": "text", "text": TEXT},
]


async def test_openai_entry_with_images_gets_image_url_parts(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("A cat and a dog."))
    done = await answer(Router([entry(0, server_a.base_url, supports_images=True)]))
    assert done.message.content == "A cat and a dog."
    sent = server_a.requests[0]["messages"]
    assert sent == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": OPENAI_PARTS}]


async def test_openai_entry_without_images_gets_the_text_reference(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("I cannot see images."))
    await answer(Router([entry(0, server_a.base_url)]))
    assert server_a.requests[0]["messages"][1] == {"role": "user", "content": TEXT}


async def test_text_mode_entry_keeps_the_images(server_a: FakeLLMServer) -> None:
    server_a.script(Reply("ok"))
    await answer(Router([entry(0, server_a.base_url, tool_calls="text", supports_images=True)]))
    assert server_a.requests[0]["messages"][1] == {"role": "user", "content": OPENAI_PARTS}


async def test_anthropic_entry_with_images_gets_base64_image_blocks_before_the_text() -> None:
    with FakeAnthropicServer() as claude:
        claude.script(Reply("A cat and a dog."))
        await answer(Router([entry(0, claude.base_url, api="anthropic", supports_images=True)]))
        body = claude.requests[0]
    assert body["system"] == "You are terse."
    assert body["messages"] == [{"role": "user", "content": ANTHROPIC_BLOCKS}]


async def test_anthropic_entry_without_images_gets_the_text_reference() -> None:
    with FakeAnthropicServer() as claude:
        claude.script(Reply("ok"))
        await answer(Router([entry(0, claude.base_url, api="anthropic")]))
        body = claude.requests[0]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": TEXT}]}]


async def test_fallback_to_an_entry_without_images_sends_it_the_text(server_a: FakeLLMServer,
                                                                     server_b: FakeLLMServer) -> None:
    server_a.script(Fail(500))
    server_b.script(Reply("From the reference: a cat."))
    done = await answer(Router([entry(0, server_a.base_url, supports_images=True), entry(1, server_b.base_url)]))
    assert (done.entry_index, done.message.content) == (1, "From the reference: a cat.")
    assert server_a.requests[0]["messages"][1]["content"] == OPENAI_PARTS
    assert server_b.requests[0]["messages"][1] == {"role": "user", "content": TEXT}


async def test_fallback_across_apis_renders_each_entry_s_own_image_format(server_a: FakeLLMServer) -> None:
    server_a.script(Fail(503))
    with FakeAnthropicServer() as claude:
        claude.script(Reply("A cat."))
        await answer(Router([entry(0, server_a.base_url, supports_images=True),
                             entry(1, claude.base_url, api="anthropic", supports_images=True)]))
        body = claude.requests[0]
    assert server_a.requests[0]["messages"][1]["content"] == OPENAI_PARTS
    assert body["messages"] == [{"role": "user", "content": ANTHROPIC_BLOCKS}]


def test_image_part_checks_its_type_and_data_and_counts_in_the_estimate() -> None:
    with pytest.raises(ValueError, match="mime_type"):
        ImagePart(mime_type="image/svg+xml", data=PNG)
    with pytest.raises(ValueError, match="needs data"):
        ImagePart(mime_type="image/png", data="")
    assert "data=" not in repr(MESSAGES[1].images[0])  # megabytes of base64 never land in a log line
    plain = ChatMessage(role="user", content=TEXT)
    assert estimate_message_tokens(MESSAGES[1]) == estimate_message_tokens(plain) + 2 * IMAGE_TOKENS
    with pytest.raises(ValueError, match="supports_images must be a bool"):
        entry(0, "http://127.0.0.1:1/v1", supports_images="yes")
