"""Built-in tools that exist only in tests (registered when this module is imported)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from capabilities.builtin.registry import register_builtin
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
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
