"""Tools reach the session's artifacts and todos through ``ToolContext.store`` (a port), never by
importing ``sessions``: with an in-memory store the built-in tools work without a database, and
without a store they fail as a tool error the model can read, not with an exception."""

from __future__ import annotations

from typing import Any

import pytest

from capabilities.builtin.registry import builtin_create
from capabilities.tests.memory_store import MemoryToolStore
from capabilities.tools import SessionStore, ToolContext, ToolError

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _context(store: SessionStore | None, events: list[tuple[str, dict[str, Any]]], session_id: int = 7) -> ToolContext:
    async def publish(event_type: str, data: dict[str, Any]) -> None:
        events.append((event_type, data))

    return ToolContext(tenant_id=1, session_id=session_id, run_id=3, tool_call_id=11, publish=publish, store=store)


async def test_todo_write_replaces_the_list_through_the_store_and_publishes_it() -> None:
    store, events = MemoryToolStore(), []
    todos = [{"content": "plan", "status": "in_progress", "priority": "high"}]
    result = await builtin_create("todo_write").execute({"todos": todos}, _context(store, events))
    assert store.todos == {7: todos}
    assert events == [("todo_updated", {"todos": todos})]
    assert result.data == todos


async def test_artifact_save_and_read_artifact_go_through_the_store() -> None:
    store, events = MemoryToolStore(), []
    context = _context(store, events)
    artifact_id = await context.artifact_save(name="out.txt", mime_type="text/plain", data=b"0123456789")
    assert events == [("artifact_updated", {"artifact_id": artifact_id, "name": "out.txt", "mime_type": "text/plain",
                                            "size_bytes": 10, "tool_call_id": 11})]
    result = await builtin_create("read_artifact").execute({"id": artifact_id, "offset": 2, "length": 3}, context)
    assert result.content.startswith("234\n") and result.data["total"] == 10
    with pytest.raises(ToolError) as info:  # another session's artifact is not found
        await builtin_create("read_artifact").execute({"id": artifact_id}, _context(store, [], session_id=8))
    assert info.value.code == "not_found"


@pytest.mark.parametrize(("tool", "arguments"), [
    ("todo_write", {"todos": []}),
    ("read_artifact", {"id": 1}),
])
async def test_without_a_store_a_tool_that_needs_one_fails_as_a_tool_error(tool: str, arguments: dict) -> None:
    with pytest.raises(ToolError) as info:
        await builtin_create(tool).execute(arguments, _context(None, []))
    assert info.value.code == "unavailable"


async def test_artifact_save_without_a_store_is_a_tool_error() -> None:
    with pytest.raises(ToolError) as info:
        await _context(None, []).artifact_save(name="x", mime_type="text/plain", data=b"x")
    assert info.value.code == "unavailable"
