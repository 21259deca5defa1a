"""``read_artifact``: read back, in slices, a large output the platform stored as an artifact."""

from __future__ import annotations

from typing import Any

from capabilities.builtin.registration import register_builtin
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

DEFAULT_LENGTH = 8_000
MAX_LENGTH = 20_000
"""Characters returned per call at most (~5k tokens)."""

DESCRIPTION = """Read part of a stored artifact (a large tool output saved as `artifact:<id>`).

Give the artifact `id`, the character `offset` to start at (default 0) and the `length` to read
(default 8000, at most 20000). The answer says how many characters remain after the slice."""


@register_builtin("read_artifact")
class ReadArtifactTool(Tool):
    spec = ToolSpec(
        name="read_artifact",
        description=DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "id": {"type": "integer", "description": "The artifact id (the number in artifact:<id>)."},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "length": {"type": "integer", "minimum": 1, "maximum": MAX_LENGTH, "default": DEFAULT_LENGTH},
            },
            "required": ["id"],
        },
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        artifact_id = _int(arguments, "id", None)
        offset = _int(arguments, "offset", 0)
        length = min(_int(arguments, "length", DEFAULT_LENGTH), MAX_LENGTH)
        if offset < 0 or length < 1:
            raise ToolError("`offset` must be ≥ 0 and `length` ≥ 1.", code="invalid_arguments")
        found = await context.session_store().artifact_text(session_id=context.session_id, artifact_id=artifact_id)
        if found is None:
            raise ToolError(f"There is no artifact {artifact_id} in this session.", code="not_found")
        name, mime_type, text = found
        if text is None:
            raise ToolError(
                f"artifact:{artifact_id} ({name}, {mime_type}) is binary and cannot be read as text.",
                code="binary_artifact",
            )
        piece = text[offset:offset + length]
        remaining = max(0, len(text) - offset - len(piece))
        footer = f"\n[artifact:{artifact_id} characters {offset}–{offset + len(piece)} of {len(text)}; {remaining} remain]"
        return ToolResult(content=piece + footer, data={"artifact_id": artifact_id, "offset": offset,
                                                         "length": len(piece), "total": len(text)})


def _int(arguments: dict[str, Any], key: str, default: int | None) -> int:
    value = arguments.get(key, default)
    if isinstance(value, str) and value.strip().removeprefix("artifact:").isdigit():
        value = int(value.strip().removeprefix("artifact:"))
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolError(f"`{key}` must be an integer.", code="invalid_arguments")
    return value

