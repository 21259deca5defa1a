"""MCP prompts through the pool (``PooledSession.prompts``: every page of ``prompts/list``, cached,
refreshed on ``prompts/list_changed`` in both protocol eras; ``prompts/get``;
``completion/complete``), against the in-test prompts server; and the pure parts of slash
commands: a tenant command's template filled in, an MCP prompt's messages as text and files.

No database.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from capabilities.commands.prompt_messages import prompt_messages_render
from capabilities.commands.rendering import CommandArgumentsError, command_arguments, command_render
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.pool import McpPool
from capabilities.tests.prompts_test_server import LANGUAGES, PNG_BYTES, PROMPTS, serve_prompts

pytestmark = [pytest.mark.timeout(60)]


def config(url: str, **overrides: Any) -> McpServerConfig:
    return McpServerConfig(**{"alias": "docs", "transport": "streamable_http", "url": url,
                              "connect_timeout_seconds": 10.0, **overrides})


async def test_prompts_are_listed_page_by_page_once_and_cached_then_got_and_completed(pool: McpPool) -> None:
    with serve_prompts() as server:
        session = pool.session(tenant_id=1, server_id=1, config=config(server.url))
        first, second = await asyncio.gather(session.prompts.list(), session.prompts.list())
        again = await session.prompts.list()
        review = first[0]
        result = await session.prompts.get("review", {"code": "print(1)", "language": "python"})
        completions = await session.prompts.complete("review", "language", "p", {"code": "print(1)"})
        await pool.aclose()
    assert first == second == again and [p.name for p in first] == [p.name for p in PROMPTS]
    assert server.state.list_cursors == [None, "10"], "one listing for three callers, both pages"
    assert review.title == "Code review" and [(a.name, a.required) for a in review.arguments] == [
        ("code", True), ("language", False)]
    assert result.messages[0].content.text == "Review this python code:\n\nprint(1)"
    assert completions.values == tuple(v for v in LANGUAGES if v.startswith("p")) and not completions.has_more
    assert server.state.completions == [("language", "p", {"code": "print(1)"})]


@pytest.mark.parametrize(("transport", "mode", "version"), [("streamable_http", "auto", "2026-07-28"),
                                                            ("sse", "legacy", "2025-11-25")])
async def test_prompt_list_changed_refreshes_the_cached_list(pool: McpPool, transport: str, mode: str,
                                                             version: str) -> None:
    with serve_prompts(transport=transport) as server:
        session = pool.session(tenant_id=1, server_id=1, config=config(server.url, transport=transport,
                                                                       protocol_mode=mode))
        before = await session.prompts.list()
        changed = session.prompts.changed
        await session.call_tool_raw("add_prompt", {"name": "late"}, timeout_seconds=10)
        await asyncio.wait_for(changed.wait(), 10)
        after = await session.prompts.list()
        await pool.aclose()
    assert session.protocol_version == version
    assert [p.name for p in after] == [p.name for p in before] + ["late"]
    assert server.state.list_cursors == [None, "10", None, "10"], "listed again after the notification only"


async def test_a_server_without_prompts_or_completions_is_not_asked(pool: McpPool) -> None:
    with serve_prompts(prompts=False) as bare, serve_prompts(completions=False) as no_completions:
        assert await pool.session(tenant_id=1, server_id=1, config=config(bare.url)).prompts.list() == ()
        session = pool.session(tenant_id=1, server_id=2, config=config(no_completions.url))
        completions = await session.prompts.complete("review", "language", "p", {})
        await pool.aclose()
    assert bare.state.list_cursors == [] and completions.values == () and no_completions.state.completions == []


# --- tenant commands' templates -----------------------------------------------------------------

DECLARED = [{"name": "language", "description": "The language.", "required": True},
            {"name": "tone", "description": "", "required": False}]


def test_a_template_is_filled_in_with_arguments_and_free_text() -> None:
    template = "Translate into $language (${tone}), costs $$5 and $HOME stays:\n\n$ARGUMENTS"
    text = command_render(template, DECLARED, {"language": "German", "ARGUMENTS": "Good morning"})
    assert text == "Translate into German (), costs $5 and $HOME stays:\n\nGood morning"
    assert command_arguments(template, DECLARED)[-1]["name"] == "ARGUMENTS"


def test_free_text_is_added_when_the_template_has_no_placeholder_for_it() -> None:
    assert command_render("Summarise in $language.", DECLARED, {"language": "French", "ARGUMENTS": " the memo "}) == (
        "Summarise in French.\n\nthe memo")
    assert [a["name"] for a in command_arguments("Summarise in $language.", DECLARED)] == ["language", "tone"]


@pytest.mark.parametrize(("values", "message"), [
    ({}, "Missing required argument: 'language'."),
    ({"language": "  "}, "Missing required argument: 'language'."),
    ({"language": "x", "colour": "red"}, "Unknown argument: 'colour'."),
    ({"language": 5}, "Argument 'language' must be a string."),
])
def test_bad_arguments_are_named(values: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandArgumentsError) as caught:
        command_render("In $language: $ARGUMENTS", DECLARED, values)
    assert caught.value.message == message


# --- MCP prompt messages ----------------------------------------------------------------------------


def test_prompt_messages_become_text_and_attachments() -> None:
    png = base64.b64encode(PNG_BYTES).decode()
    rendered = prompt_messages_render([
        {"role": "user", "content": {"type": "text", "text": "What is in this picture?"}},
        {"role": "user", "content": {"type": "image", "data": png, "mimeType": "image/png"}},
        {"role": "user", "content": {"type": "resource", "resource": {"uri": "file:///notes.txt", "text": "hello"}}},
        {"role": "user", "content": {"type": "resource_link", "uri": "https://example.com/a", "name": "a"}},
        {"role": "assistant", "content": {"type": "text", "text": "I will look."}},
    ], prefix="picture")
    assert rendered.text == ("User: What is in this picture?\n\nUser: file:///notes.txt:\n\n```\nhello\n```\n\n"
                             "User: [a](https://example.com/a)\n\nAssistant: I will look.")
    assert rendered.attachments == [{"filename": "picture-1.png", "mime_type": "image/png", "data": png}]
    only_user = prompt_messages_render([{"role": "user", "content": {"type": "text", "text": "Hi"}}])
    assert only_user.text == "Hi" and only_user.attachments == []


async def test_a_server_slower_than_the_deadline_is_named_and_the_others_listed() -> None:
    from capabilities.commands.worker import ServerTarget, prompts_list
    from capabilities.mcp.pool import mcp_pool
    from capabilities.tests.mcp_test_server import silent_listener

    with serve_prompts() as server, silent_listener() as port:
        targets = [ServerTarget(1, "docs", config(server.url)),
                   ServerTarget(2, "hung", config(f"http://127.0.0.1:{port}/mcp", alias="hung", connect_timeout_seconds=1.5)),
                   ServerTarget(3, "gone", None, "You have not connected 'gone' yet.")]
        try:
            answer = await prompts_list(1, targets, deadline_seconds=1.0)
        finally:
            await mcp_pool().aclose()
    docs, hung, gone = answer["servers"]
    assert len(docs["prompts"]) == 14 and docs["error"] == ""
    assert hung["prompts"] == [] and "did not list its prompts within 1 s" in hung["error"]
    assert gone["error"] == "You have not connected 'gone' yet."
