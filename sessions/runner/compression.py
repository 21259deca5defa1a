"""Write-time compression of tool results (DESIGN §6).

A tool result is stored whole (``ToolCall.result``, and as an artifact when large); what the
model reads (the tool message) is a compressed rendering, computed once when the result is
written so every later turn re-sends the same, smaller text:

- JSON results: nesting deeper than :data:`MAX_DEPTH` becomes a stub, arrays longer than
  :data:`MAX_ARRAY_ITEMS` keep their first items plus a count, strings longer than
  :data:`MAX_STRING_CHARS` keep a head and a tail;
- any result still longer than :data:`ARTIFACT_MIN_CHARS` is stored as an artifact and the
  model gets its head and tail plus the handle ``artifact:<id>`` to read the rest with
  ``read_artifact``.

The same three moves (truncate depth, sample long arrays, head+tail long strings) are what
tool-output "observation" compressors in agent frameworks do; the thresholds here are ours:
a 4k-character result is ~1k tokens, the size below which compression is not worth the
information lost.
"""

from __future__ import annotations

import json
from typing import Any

COMPRESS_MIN_CHARS = 4_000
"""Results shorter than this reach the model unchanged."""
MAX_DEPTH = 6
MAX_ARRAY_ITEMS = 20
KEPT_ARRAY_ITEMS = 10
MAX_STRING_CHARS = 2_000
STRING_HEAD_CHARS = 1_200
STRING_TAIL_CHARS = 400
ARTIFACT_MIN_CHARS = 16_000
"""Results (after compression) longer than this are stored as artifacts (~4k tokens)."""
ARTIFACT_HEAD_CHARS = 6_000
ARTIFACT_TAIL_CHARS = 2_000


def compress_json_value(value: Any, *, depth: int = 0) -> Any:
    """``value`` with deep nesting stubbed, long arrays sampled and long strings cut.

    Returns a new JSON-serialisable value; ``value`` is not modified.
    """
    if isinstance(value, str):
        return head_tail(value, STRING_HEAD_CHARS, STRING_TAIL_CHARS) if len(value) > MAX_STRING_CHARS else value
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"{{… object with {len(value)} keys}}"
        return {k: compress_json_value(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            return f"[… {len(value)} items]"
        items = [compress_json_value(v, depth=depth + 1) for v in value[:KEPT_ARRAY_ITEMS if len(value) > MAX_ARRAY_ITEMS else None]]
        if len(value) > MAX_ARRAY_ITEMS:
            items.append(f"… {len(value) - KEPT_ARRAY_ITEMS} more items ({len(value)} in all)")
        return items
    return value


def compress_result(text: str) -> str:
    """What the model should read of tool result ``text`` (before any artifact step).

    JSON results of :data:`COMPRESS_MIN_CHARS` or more are compressed structurally
    (:func:`compress_json_value`); other text is returned unchanged.
    """
    if len(text) < COMPRESS_MIN_CHARS:
        return text
    stripped = text.lstrip()
    if not stripped or stripped[0] not in "[{":
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    compressed = json.dumps(compress_json_value(value), ensure_ascii=False, indent=1)
    return compressed if len(compressed) < len(text) else text


def head_tail(text: str, head: int, tail: int) -> str:
    """The first ``head`` and last ``tail`` characters of ``text`` with a marker between."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[… {len(text) - head - tail} characters omitted …]\n{text[-tail:]}"


def artifact_preview(text: str, *, artifact_id: int, total_chars: int) -> str:
    """The model's view of a result stored as artifact ``artifact_id``."""
    return (
        head_tail(text, ARTIFACT_HEAD_CHARS, ARTIFACT_TAIL_CHARS)
        + f"\n[The full result ({total_chars} characters) is stored as artifact:{artifact_id}; "
        f"read any part of it with read_artifact(id={artifact_id}, offset, length).]"
    )
