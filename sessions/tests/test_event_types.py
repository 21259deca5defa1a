"""The event payload schema (sessions/event_types.py) against its three other holders: the
API reference's "Live events" table (docs/api.md), the SPA's frame handlers, and what the platform publishes
(the last is checked for every test by conftest.py's ``_event_payloads_checked``; here: that
the check bites).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from sessions import event_types
from sessions.event_types import (
    EVENT_PAYLOADS,
    EVENT_TYPES,
    SUBRUN_FIELDS,
    EventPayloadError,
    payload_fields,
    validate_event,
)

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
API_DOCS = ROOT / "docs" / "api.md"
FRONTEND = ROOT / "frontend" / "static" / "frontend"


# --- the schema itself -----------------------------------------------------------------------


def test_every_payload_class_is_frozen_keyword_only_and_named_by_its_type() -> None:
    from sessions import events

    assert events.EVENT_TYPES is EVENT_TYPES
    for name, cls in EVENT_PAYLOADS.items():
        assert cls.type == name
        assert typing.get_origin(typing.get_type_hints(cls)["type"]) is typing.ClassVar
        assert cls.__dataclass_params__.frozen, name
        assert all(f.kw_only for f in dataclasses.fields(cls)), name
        assert cls.__doc__, name


@pytest.mark.parametrize(
    ("event_type", "data", "complaint"),
    [
        ("run_queued", {"input": "hi", "position": 2}, "position"),  # unknown field
        ("tool_call_started", {"tool_call_id": "7", "name": "x", "arguments": {}}, "tool_call_id"),  # no coercion
        ("tool_call_started", {"tool_call_id": 7, "name": "x"}, "arguments"),  # missing
        ("run_queued", {"resumed": 1}, "resumed"),  # an int is not a bool
        ("todo_updated", {"todos": [{"content": "a", "status": "done", "priority": "low"}]}, "todos.0.status"),
        ("run_awaiting_approval", {"approvals": [{"approval_id": 1}]}, "approvals.0"),
        ("artifact_updated", {"name": "a.txt"}, "artifact_updated needs"),
        ("artifact_updated", {"artifact_id": 1, "name": "a", "mime_type": "t", "size_bytes": 1, "tool_call_id": 2,
                              "document_id": 3}, "not both"),
        ("no_such_event", {}, "unknown event type"),
    ],
)
def test_validate_event_rejects_unknown_fields_and_wrong_types(event_type, data, complaint) -> None:
    with pytest.raises(EventPayloadError, match=re.escape(complaint)):
        validate_event(event_type, data)


def test_validate_event_accepts_each_documented_variant() -> None:
    approval = {"approval_id": 1, "tool_call_id": 2, "kind": "tool_call", "status": "pending", "tool_name": "t",
                "arguments": {"a": 1}, "reason": "", "question": "", "expires_at": "2026-01-01T00:00:00+00:00",
                "sub_run_id": None, "skill": None, "elicitation": None,
                "approvers": {"requester": False, "roles": ["admin"], "user_ids": [3]}, "on_timeout": "deny"}
    elicitation = {**approval, "kind": "elicitation", "question": "Where to?", "elicitation": {
        "mode": "form", "message": "Where to?", "schema": {"type": "object", "properties": {}}, "url": "",
        "server": "travel", "tool": "book"}}
    for event_type, data in [
        ("run_awaiting_approval", {"approvals": [elicitation]}),
        ("run_queued", {"input": "hi"}), ("run_queued", {"resumed": True}),
        ("run_running", {"attempt": 1}), ("run_running", {"steered_into": 4}),
        ("run_running", {"attempt": 1, "skill": "s", "depth": 1, "task": "t", "parent_run_id": 1,
                         "parent_tool_call_id": 2}),
        ("run_awaiting_approval", {"approvals": [approval]}),
        ("model_retry", {"entry_index": 0, "provider_name": "p", "model": "m", "error_class": "timeout",
                         "attempt": 2, "wait_seconds": 0.5}),
        ("model_retry", {"turn": 1, "error_class": "stream_interrupted", "turn_restarted": True}),
        ("compaction_completed", {"ok": False, "compaction_id": 1, "attempt": 1, "error": "x"}),
        ("artifact_updated", {"document_id": 1, "title": "t", "op": "patch", "version": 2}),
        ("tool_call_progress", {"tool_call_id": 1, "message": "out", "stream": "stdout", "progress": 3, "total": None}),
    ]:
        validate_event(event_type, data)


def test_a_published_event_that_does_not_match_its_schema_fails_the_test(_event_payloads_checked) -> None:
    """conftest.py's autouse check sees what the platform publishes (here: through event_body,
    which every publish path goes through)."""
    from sessions import events

    events.event_body(session_id=1, run_id=1, type="run_completed", data={"reply": "ok"})
    assert _event_payloads_checked == []
    events.event_body(session_id=1, run_id=1, type="run_completed", data={"reply": "ok", "surprise": 1})
    assert len(_event_payloads_checked) == 1 and "surprise" in _event_payloads_checked[0]
    _event_payloads_checked.clear()  # (else this test fails at teardown, as it should in any other)


# --- the API reference's table ----------------------------------------------------------------


def _braced_groups(text: str) -> list[str]:
    """The contents of the top-level ``{...}`` groups of ``text``."""
    groups, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                groups.append(text[start:i])
    return groups


def _top_level_keys(group: str) -> dict[str, str]:
    """``{key: its value text}`` of one ``a, b: true, c: [{x, y}]`` group (nested groups kept whole)."""
    items, depth, current = [], 0, ""
    for ch in group:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    keys = {}
    for item in items:
        name, _, value = item.strip().partition(":")
        if name.strip():
            keys[name.strip()] = value.strip()
    return keys


def _documented_rows() -> dict[str, str]:
    section = API_DOCS.read_text().split("## Live events", 1)[1]
    table = section.split("| type | data |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for row in table.splitlines()[2:]:
        _, first, cell, *_ = row.split("|")
        for name in re.findall(r"`([a-z_]+)`", first):
            rows[name] = cell
    return rows


def _item_class(cls: type, field: str) -> type | None:
    hint = typing.get_type_hints(cls, vars(event_types))[field]
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if dataclasses.is_dataclass(item):
            return item
    return None


def test_the_api_docs_table_names_exactly_each_payload_s_fields() -> None:
    rows = _documented_rows()
    assert set(rows) == EVENT_TYPES
    wrong = {}
    for name, cell in rows.items():
        documented: dict[str, str] = {}
        for group in _braced_groups(cell.replace("`", "")):
            documented.update(_top_level_keys(group))
        if set(documented) != payload_fields(name):
            wrong[name] = {"only in docs/api.md": sorted(set(documented) - payload_fields(name)),
                           "only in event_types": sorted(payload_fields(name) - set(documented))}
            continue
        for field, value in documented.items():  # lists of objects: their items' fields too
            item = _item_class(EVENT_PAYLOADS[name], field)
            if item is not None:
                inner = _braced_groups(value)
                item_fields = {f.name for f in dataclasses.fields(item)}
                if len(inner) != 1 or set(_top_level_keys(inner[0])) != item_fields:
                    wrong[f"{name}.{field}"] = {"docs/api.md": value, "event_types": sorted(item_fields)}
    assert wrong == {}


def test_the_api_docs_say_sub_run_events_carry_their_parent() -> None:
    section = re.split(r"\n#{2,3} ", API_DOCS.read_text().split("## Live events", 1)[1], maxsplit=1)[0]
    lines = [line for line in section.split("\n\n") if "sub-run" in line and "{" in line]
    assert any(set(_top_level_keys(g)) == SUBRUN_FIELDS for line in lines
               for g in _braced_groups(line.replace("`", ""))), "docs/api.md: the sub-run fields sentence"


# --- the SPA's handlers -------------------------------------------------------------------------


def _block(text: str, open_brace: int) -> str:
    """``text`` from ``open_brace`` (a ``{``) to its matching ``}`` (JS template ``${}`` included)."""
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace:i + 1]
    raise AssertionError("unbalanced braces")


def _function_params_fields(name: str) -> set[str]:
    """Fields read from the second parameter of ``function <name>(a, b)`` in the SPA's modules."""
    for path in FRONTEND.glob("*.js"):
        text = path.read_text()
        match = re.search(rf"function {name}\((\w+), (\w+)\)\s*\{{", text)
        if match:
            return set(re.findall(rf"\b{match.group(2)}\.(\w+)", _block(text, match.end() - 1)))
    raise AssertionError(f"function {name} not found in {FRONTEND}")


def _spa_handlers() -> tuple[dict[str, set[str]], set[str]]:
    """``({event type: data fields its handler reads}, fields read for every frame)`` of
    chat_state.js's ``applyFrame``: its ``if (frame.type === 'x')`` branches and its ``handlers``
    object; a handler that hands ``data`` to another function reads what that function reads."""
    text = (FRONTEND / "chat_state.js").read_text()
    start = text.index("applyFrame(frame) {")
    body = _block(text, text.index("{", start))
    handlers: dict[str, set[str]] = {}
    rest = body
    for match in re.finditer(r"if \(frame\.type === '(\w+)'\) \{", body):
        branch = _block(body, match.end() - 1)
        handlers[match.group(1)] = set(re.findall(r"\bdata\.(\w+)", branch))
        rest = rest.replace(branch, "")
    table_start = body.index("const handlers = {")
    table = _block(body, body.index("{", table_start))
    rest = rest.replace(table, "")
    entries = re.split(r"\n\s*(\w+): \(run\) =>", table)
    for name, code in zip(entries[1::2], entries[2::2], strict=False):
        fields = set(re.findall(r"\bdata\.(\w+)", code))
        for helper in re.findall(r"(\w+)\(run, data\)", code):
            fields |= _function_params_fields(helper)
        handlers[name] = fields
    common = set(re.findall(r"\bdata\.(\w+)", rest))
    return handlers, common


def test_the_spa_handles_only_known_event_types_and_reads_only_their_fields() -> None:
    handlers, common = _spa_handlers()
    assert len(handlers) >= 15, "chat_state.js's applyFrame handlers were not found"
    assert set(handlers) - EVENT_TYPES == set(), "the SPA handles event types that are never published"
    assert common <= SUBRUN_FIELDS, "fields read for every frame must be in every payload"
    unknown = {name: sorted(fields - payload_fields(name) - SUBRUN_FIELDS)
               for name, fields in handlers.items() if name in EVENT_TYPES}
    assert {k: v for k, v in unknown.items() if v} == {}, "the SPA reads fields its events do not have"


def test_every_event_type_the_spa_names_is_published() -> None:
    """String literals that look like event types in the SPA's frame code are event types
    (a misspelt ``'tool_call_succeded'`` would be handled never)."""
    handlers, _ = _spa_handlers()
    for name in handlers:
        assert name in EVENT_TYPES, name
