"""Tool calls written as text: parsing, streaming holdback, prompt and history rendering."""

from __future__ import annotations

import json
import random
import re

import pytest

from llm.toolcall_parsing import (
    TOOL_RESULTS_FOLLOW_UP,
    ToolCallHoldback,
    messages_for_text_mode,
    mint_call_id,
    parse_tool_calls,
    render_tools_prompt,
)
from llm.types import ChatMessage, ToolCallRequest, ToolSpec

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

TOKYO = '{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}'
TOKYO_CALL = ("get_current_time", {"timezone": "Asia/Tokyo"})

# (id, text, expected remaining text, expected [(name, arguments)])
CASES: list[tuple[str, str, str, list[tuple[str, dict]]]] = [
    # The exact shapes Qwen2.5-Coder-0.5B writes.
    ("bare_json", TOKYO, "", [TOKYO_CALL]),
    ("bare_json_newline", TOKYO + "\n", "", [TOKYO_CALL]),
    ("json_fence", f"```json\n{TOKYO}\n```", "", [TOKYO_CALL]),
    ("json_fence_no_label", f"```\n{TOKYO}\n```", "", [TOKYO_CALL]),
    ("json_fence_inline_close", f"```json\n{TOKYO}```", "", [TOKYO_CALL]),
    ("tool_call_tags", f"<tool_call>\n{TOKYO}\n</tool_call>", "", [TOKYO_CALL]),
    ("tool_call_tags_tight", f"<tool_call>{TOKYO}</tool_call>", "", [TOKYO_CALL]),
    ("tool_call_tag_unclosed_at_end", f"<tool_call>\n{TOKYO}\n", "", [TOKYO_CALL]),
    ("text_before_bare", f"I will check the time.\n{TOKYO}", "I will check the time.", [TOKYO_CALL]),
    # Text after the first call is dropped (written before any result: see ToolCallHoldback).
    ("text_before_and_after_fence", f"Checking.\n```json\n{TOKYO}\n```\nOne moment.", "Checking.", [TOKYO_CALL]),
    ("text_around_tags", f"Sure! <tool_call>{TOKYO}</tool_call> Done.", "Sure!", [TOKYO_CALL]),
    (
        "invented_answer_after_the_call",  # seen from Qwen2.5-Coder-0.5B on this machine
        f"```json\n{TOKYO}\n```\n\nThe current time in Tokyo is 2023-10-25T07:45:30+09:00.",
        "",
        [TOKYO_CALL],
    ),
    (
        "several_tags",
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
        "",
        [("a", {"x": 1}), ("b", {})],
    ),
    (
        "json_list",
        '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "z"}}]',
        "",
        [("a", {"x": 1}), ("b", {"y": "z"})],
    ),
    ("list_in_fence", '```json\n[{"name": "a", "arguments": {}}]\n```', "", [("a", {})]),
    ("parameters_synonym", '{"name": "a", "parameters": {"x": 1}}', "", [("a", {"x": 1})]),
    ("arguments_as_string", '{"name": "a", "arguments": "{\\"x\\": 1}"}', "", [("a", {"x": 1})]),
    ("no_arguments", '{"name": "list_todos"}', "", [("list_todos", {})]),
    (
        "openai_shape",
        '{"type": "function", "function": {"name": "a", "arguments": "{\\"x\\": 2}"}}',
        "",
        [("a", {"x": 2})],
    ),
    ("indented_bare", f"  {TOKYO}", "", [TOKYO_CALL]),
    ("braces_in_strings", '{"name": "echo", "arguments": {"s": "a } b { c \\" }"}}', "", [("echo", {"s": 'a } b { c " }'})]),
    # Not tool calls: left as text, unchanged.
    ("plain_text", "The time in Tokyo is 10:00.", "The time in Tokyo is 10:00.", []),
    ("json_without_name", '{"timezone": "Asia/Tokyo"}', '{"timezone": "Asia/Tokyo"}', []),
    ("json_with_other_keys", '{"name": "Ada", "born": 1815}', '{"name": "Ada", "born": 1815}', []),
    ("name_not_a_function_name", '{"name": "Ada Lovelace"}', '{"name": "Ada Lovelace"}', []),
    ("malformed_json", '{"name": "a", "arguments": {"x": 1}', '{"name": "a", "arguments": {"x": 1}', []),
    ("malformed_in_tags", "<tool_call>{name: a}</tool_call>", "<tool_call>{name: a}</tool_call>", []),
    ("malformed_in_fence", "```json\n{oops\n```", "```json\n{oops\n```", []),
    ("brace_prose", "{this is prose}\nmore", "{this is prose}\nmore", []),
    ("inline_json_is_text", f"Example: {TOKYO}", f"Example: {TOKYO}", []),
    ("python_fence", '```python\nd = {"name": "x"}\n{"name": "a"}\n```\nok', '```python\nd = {"name": "x"}\n{"name": "a"}\n```\nok', []),
    ("markdown_link_line", "[docs](https://example.com)\n", "[docs](https://example.com)\n", []),
    ("number_list", "[1, 2, 3]", "[1, 2, 3]", []),
    ("mixed_list_is_text", '[{"name": "a"}, 3]', '[{"name": "a"}, 3]', []),
    ("lonely_angle", "a < b and c <tool", "a < b and c <tool", []),
    ("empty", "", "", []),
]


def _simplify(calls: list[ToolCallRequest]) -> list[tuple[str, dict]]:
    return [(c.name, c.parsed_arguments()) for c in calls]


@pytest.mark.parametrize(("text", "expected_text", "expected_calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_tool_calls(text: str, expected_text: str, expected_calls: list[tuple[str, dict]]) -> None:
    remaining, calls = parse_tool_calls(text)

    assert remaining == expected_text
    assert _simplify(calls) == expected_calls
    assert all(re.fullmatch(r"call_[0-9a-f]{12}", c.id) for c in calls)


def test_arguments_text_is_kept_as_written() -> None:
    _, calls = parse_tool_calls('{"name": "a", "arguments": "{\\"x\\":1}"}')

    assert calls[0].arguments == '{"x":1}'


def test_minted_ids_are_unique() -> None:
    ids = {mint_call_id() for _ in range(1000)}

    assert len(ids) == 1000


@pytest.mark.parametrize(("text", "expected_text", "expected_calls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_holdback_matches_parse_for_any_chunking(text: str, expected_text: str, expected_calls: list) -> None:
    rng = random.Random(text)
    for _ in range(25):
        holdback = ToolCallHoldback()
        released, pos = [], 0
        while pos < len(text):
            step = rng.randint(1, 7)
            released.append(holdback.feed(text[pos : pos + step]))
            pos += step
        tail, calls = holdback.finish()

        assert "".join(released) + tail == expected_text
        assert _simplify(calls) == expected_calls


def test_holdback_releases_prose_immediately() -> None:
    holdback = ToolCallHoldback()

    assert holdback.feed("The time ") == "The time"  # trailing space waits for what follows
    assert holdback.feed("is now") == " is now"
    assert holdback.feed(".\n") == "."
    assert holdback.feed("Bye") == "\nBye"
    assert holdback.finish() == ("", [])


@pytest.mark.parametrize(
    "text",
    [TOKYO, f"```json\n{TOKYO}\n```", f"<tool_call>\n{TOKYO}\n</tool_call>", f'[{TOKYO}]'],
    ids=["bare", "fence", "tags", "list"],
)
def test_holdback_never_streams_tool_call_json(text: str) -> None:
    holdback = ToolCallHoldback()

    released = "".join(holdback.feed(ch) for ch in f"Let me check.\n{text}")
    tail, calls = holdback.finish()

    assert released == "Let me check."
    assert tail == ""
    assert _simplify(calls) == [TOKYO_CALL]


def test_holdback_releases_non_call_json_when_it_closes() -> None:
    holdback = ToolCallHoldback()

    assert holdback.feed('{"name": "Ada", ') == ""
    assert holdback.holding
    assert holdback.feed('"born": 1815}') == '{"name": "Ada", "born": 1815}'


def test_holdback_releases_code_fences_line_by_line() -> None:
    holdback = ToolCallHoldback()

    assert holdback.feed("```python\n") == "```python"
    assert holdback.feed("x = 1\n{") == "\nx = 1\n{"
    assert holdback.feed("}\n``") == "}"
    assert holdback.feed("`\ndone") == "\n```\ndone"


def test_holdback_text_after_finish_is_an_error() -> None:
    holdback = ToolCallHoldback()
    holdback.finish()

    with pytest.raises(RuntimeError):
        holdback.feed("x")


# --- Prompt and history ---------------------------------------------------------------------

TIME_TOOL = ToolSpec(
    name="get_current_time",
    description="Current time in a timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)


def test_render_tools_prompt_lists_each_tool_as_json() -> None:
    prompt = render_tools_prompt([TIME_TOOL])

    assert prompt.startswith("# Tools")
    inside = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in inside.splitlines()] == [TIME_TOOL.to_openai()]
    assert "<tool_call>" in prompt and "</tool_call>" in prompt
    assert render_tools_prompt([]) == ""


def test_messages_for_text_mode_rewrites_calls_and_results() -> None:
    call_a = ToolCallRequest(id="call_1", name="get_current_time", arguments='{"timezone": "UTC"}')
    call_b = ToolCallRequest(id="call_2", name="broken", arguments="{not json")
    history = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Time?"),
        ChatMessage(role="assistant", content="Checking.", tool_calls=(call_a, call_b)),
        ChatMessage(role="tool", content="10:00", tool_call_id="call_1", name="get_current_time"),
        ChatMessage(role="tool", content="error", tool_call_id="call_2", name="broken"),
        ChatMessage(role="assistant", content="It is 10:00."),
    ]

    out = messages_for_text_mode(history, [TIME_TOOL])

    assert [m.role for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[0].content.startswith("Be brief.\n\n# Tools")
    assert out[2].content == (
        "Checking.\n"
        '<tool_call>\n{"name": "get_current_time", "arguments": {"timezone": "UTC"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "broken", "arguments": "{not json"}\n</tool_call>'
    )
    assert out[3].content == (
        "<tool_response>\n10:00\n</tool_response>\n<tool_response>\nerror\n</tool_response>\n"
        + TOOL_RESULTS_FOLLOW_UP
    )
    assert all(not m.tool_calls and m.tool_call_id is None for m in out)
    # Round trip: the rendered call parses back.
    assert _simplify(parse_tool_calls(out[2].content)[1][:1]) == [("get_current_time", {"timezone": "UTC"})]


def test_messages_for_text_mode_adds_a_system_message_when_missing() -> None:
    out = messages_for_text_mode([ChatMessage(role="user", content="hi")], [TIME_TOOL])

    assert [m.role for m in out] == ["system", "user"]
    assert out[0].content == render_tools_prompt([TIME_TOOL])


def test_messages_for_text_mode_without_tools_keeps_the_system_prompt() -> None:
    history = [ChatMessage(role="system", content="S"), ChatMessage(role="user", content="hi")]

    assert messages_for_text_mode(history, []) == history
