"""Text the platform stores must not contain U+0000: PostgreSQL refuses it in ``text`` and ``jsonb``.

A NUL can reach the runner from outside at any time: a command's output, a web page, an MCP
result, a model's streamed text or tool arguments (as a raw character, or inside JSON as the
escape ``\\u0000``, which ``jsonb`` refuses too). One NUL used to fail the whole run with
``internal_error``. Everything written from tool results, model output and tool arguments
goes through these functions, which replace each NUL with U+FFFD (the replacement
character), so what was there stays visible and nothing else changes.

Pure and cheap: a string without NUL is returned as it is (one ``in`` scan).
"""

from __future__ import annotations

import re
from typing import Any

NUL = "\x00"
REPLACEMENT = "\ufffd"
"""What a NUL becomes (U+FFFD REPLACEMENT CHARACTER)."""

_JSON_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
"""A JSON ``\\u0000`` escape that is not itself escaped (an even number of backslashes before it)."""


def clean_text(text: str) -> str:
    """``text`` with every U+0000 replaced by U+FFFD (the same object when there is none).

    Args:
        text: Any string (a non-string is returned unchanged).
    """
    if isinstance(text, str) and NUL in text:
        return text.replace(NUL, REPLACEMENT)
    return text


def clean_json(value: Any) -> Any:
    """A JSON-like value (dicts, lists, tuples, strings, numbers…) with NULs replaced in every
    string, dictionary keys included. Values without NUL are returned as they are; others are
    copied (the input is never mutated)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        changed = False
        for key, item in value.items():
            new_key, new_item = clean_json(key), clean_json(item)
            changed = changed or new_key is not key or new_item is not item
            out[new_key] = new_item
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [clean_json(item) for item in value]
        if all(a is b for a, b in zip(items, value, strict=False)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


def clean_json_text(text: str) -> str:
    """JSON text (e.g. a model's tool arguments) with NULs removed at both levels: raw NUL
    characters and unescaped ``\\u0000`` escapes become U+FFFD (``\\ufffd``), so the text
    still parses to the same value, NULs replaced, and fits ``text`` and ``jsonb``.

    Args:
        text: JSON text, valid or not (invalid text is cleaned the same way).
    """
    text = clean_text(text)
    if isinstance(text, str) and "\\u0000" in text:
        text = _JSON_NUL_ESCAPE.sub(lambda m: m.group(1) + "\\ufffd", text)
    return text


__all__ = ["NUL", "REPLACEMENT", "clean_json", "clean_json_text", "clean_text"]
