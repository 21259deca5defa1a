"""An MCP tool result for the model (capabilities/mcp/results.py): structured content that
repeats an image's base64 (bare or as a data: URL) carries the image's summary instead, in the
text the model reads and in the stored data; other values are kept."""

from __future__ import annotations

import base64
import json

import mcp_types

from capabilities.mcp.results import to_tool_result

PNG = base64.b64encode(b"\x89PNG" + bytes(6000)).decode()


def test_structured_content_does_not_repeat_the_image():
    result = mcp_types.CallToolResult(
        content=[mcp_types.ImageContent(type="image", data=PNG, mime_type="image/png")],
        structured_content={"image": PNG, "url": f"data:image/png;base64,{PNG}", "width": 64,
                            "frames": [{"png": PNG}], "caption": "a chart"},
    )
    out = to_tool_result(result)
    summary = "[image image/png, 6004 bytes]"
    assert out.data == {"image": summary, "url": summary, "width": 64, "frames": [{"png": summary}],
                        "caption": "a chart"}
    assert PNG not in out.content and len(out.content) < 500
    assert json.loads(out.content.split("\n")[0]) == out.data  # no text block: the JSON leads


def test_structured_content_without_binary_is_unchanged():
    other = base64.b64encode(b"something else" * 10).decode()
    result = mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text="done")],
        structured_content={"token": other, "n": [1, 2]},
    )
    out = to_tool_result(result)
    assert out.data == {"token": other, "n": [1, 2]} and out.content == "done"
