"""Built-in tools that exist only for benchmarks (registered when this module is imported)."""

from __future__ import annotations

import hashlib
from typing import Any

from capabilities.builtin.registry import register_builtin
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec


def document(path: str, chars: int) -> str:
    """``chars`` characters of deterministic, source-like text for ``path`` (same path, same text)."""
    lines: list[str] = []
    size, i = 0, 0
    while size < chars:
        digest = hashlib.sha256(f"{path}:{i}".encode()).hexdigest()
        line = f"def f_{digest[:8]}(x):  # line {i} of {path}\n    return x * {int(digest[8:12], 16)} + {digest[12:20]!r}\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)[:chars]


@register_builtin("bench_read_file")
class ReadFileTool(Tool):
    """Returns a file-sized result: ``size`` characters (default 4000) of text for ``path``."""

    spec = ToolSpec(
        name="bench_read_file", description="Read the file at `path`.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}, "size": {"type": "integer"}},
                    "required": ["path"]},
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        if not isinstance(arguments.get("path"), str):
            raise ToolError("`path` (a string) is required.", code="invalid_arguments")
        return ToolResult(content=document(arguments["path"], int(arguments.get("size") or 4000)))
