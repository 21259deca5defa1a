"""``todo_write``: the session's todo list, rewritten whole on every call."""

from __future__ import annotations

from typing import Any

from capabilities.builtin.registration import register_builtin
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

MAX_TODOS = 50
_STATUSES = ("pending", "in_progress", "completed")
_PRIORITIES = ("high", "medium", "low")

DESCRIPTION = """Replace the session's todo list with `todos`.

Use it to plan multi-step work and to show progress: send the whole list every time, with
each item's status (pending, in_progress, completed) and priority (high, medium, low). Keep at
most one item in_progress. Returns the list as stored."""


@register_builtin("todo_write")
class TodoWriteTool(Tool):
    spec = ToolSpec(
        name="todo_write",
        description=DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "maxItems": MAX_TODOS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "description": "What to do (≤ 500 characters)."},
                            "status": {"type": "string", "enum": list(_STATUSES)},
                            "priority": {"type": "string", "enum": list(_PRIORITIES)},
                        },
                        "required": ["content", "status"],
                    },
                }
            },
            "required": ["todos"],
        },
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        todos = _validate(arguments)
        stored = await context.session_store().todos_replace(session_id=context.session_id, todos=todos)
        if context.publish is not None:
            await context.publish("todo_updated", {"todos": stored})
        lines = [f"- [{t['status']}] ({t['priority']}) {t['content']}" for t in stored]
        return ToolResult(content="Todo list saved:\n" + "\n".join(lines) if lines else "Todo list cleared.", data=stored)


def _validate(arguments: dict[str, Any]) -> list[dict[str, str]]:
    todos = arguments.get("todos")
    if not isinstance(todos, list):
        raise ToolError("`todos` must be a list of {content, status, priority} objects.", code="invalid_arguments")
    if len(todos) > MAX_TODOS:
        raise ToolError(f"At most {MAX_TODOS} todos.", code="invalid_arguments")
    out = []
    for i, item in enumerate(todos):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str) or not item["content"].strip():
            raise ToolError(f"todos[{i}] needs a non-empty string `content`.", code="invalid_arguments")
        status = item.get("status", "pending")
        priority = item.get("priority", "medium")
        if status not in _STATUSES:
            raise ToolError(f"todos[{i}].status must be one of {_STATUSES}, got {status!r}.", code="invalid_arguments")
        if priority not in _PRIORITIES:
            raise ToolError(f"todos[{i}].priority must be one of {_PRIORITIES}, got {priority!r}.", code="invalid_arguments")
        out.append({"content": item["content"].strip()[:500], "status": status, "priority": priority})
    return out

