"""Built-in tools that exist only in tests (registered when this module is imported)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from capabilities.builtin.registry import register_builtin
from capabilities.tools import ApprovalRequired, Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

# Wall-clock windows of test_sleep executions, to observe parallelism.
SLEEP_WINDOWS: list[tuple[float, float]] = []


@register_builtin("test_echo")
class EchoTool(Tool):
    spec = ToolSpec(
        name="test_echo", description="Echo `text` back.",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        if "text" not in arguments:
            raise ToolError("`text` is required.", code="invalid_arguments")
        return ToolResult(content=f"echo: {arguments['text']}", data={"text": arguments["text"]})


@register_builtin("test_sleep")
class SleepTool(Tool):
    spec = ToolSpec(
        name="test_sleep", description="Sleep `seconds` seconds.",
        parameters={"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        start = time.monotonic()
        await asyncio.sleep(float(arguments["seconds"]))
        SLEEP_WINDOWS.append((start, time.monotonic()))
        return ToolResult(content=f"slept {arguments['seconds']} s")


@register_builtin("test_append")
class AppendTool(Tool):
    """Appends a line to a file: counts executions across processes (the SIGKILL test)."""

    spec = ToolSpec(
        name="test_append", description="Append `text` as a line to the file `path`.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["path", "text"]},
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        with open(arguments["path"], "a", encoding="utf-8") as f:
            f.write(f"{arguments['text']}\n")
        return ToolResult(content=f"appended {arguments['text']}")


@register_builtin("test_guarded")
class GuardedTool(Tool):
    """Asks for approval itself (like typing into a password field) unless the call was approved."""

    spec = ToolSpec(
        name="test_guarded", description="Do something sensitive with `text`.",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    )
    executions: list[str] = []

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        if not context.approved:
            raise ApprovalRequired(f"Sensitive action with {arguments.get('text')!r}")
        GuardedTool.executions.append(arguments["text"])
        return ToolResult(content=f"did {arguments['text']}")


@register_builtin("test_big")
class BigTool(Tool):
    """Returns `chars` characters of text (or a JSON array of `items` objects)."""

    spec = ToolSpec(
        name="test_big", description="Return a large result.",
        parameters={"type": "object", "properties": {"chars": {"type": "integer"}, "items": {"type": "integer"}}},
    )
    untrusted = True

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        if "items" in arguments:
            import json

            return ToolResult(content=json.dumps([{"n": i, "text": "x" * 50} for i in range(arguments["items"])]))
        chars = int(arguments.get("chars", 100))
        line = "0123456789abcdefghijklmnopqrstuvwxyz\n"
        return ToolResult(content=(line * (chars // len(line) + 1))[:chars])
