"""JSON with a bounded nesting depth, for the API's request bodies and the WebSocket frames.

Python's ``json`` parser recurses once per nesting level: 20,000 ``[`` raise ``RecursionError``,
which DRF does not catch (it answered 500, with Django's debug page when DEBUG was on, to
anonymous callers too: login, pairings). A document just under the interpreter's limit parses,
and then breaks whatever walks it recursively later (serializers, ``json.dumps``, ``deepcopy``).
:func:`json_loads_bounded` refuses both: deeper than :data:`MAX_JSON_DEPTH` is a
:class:`JSONDepthError` (a ``ValueError``), as is malformed JSON.

:class:`BoundedJSONParser` is the project's default DRF JSON parser (settings
``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``): a refused body answers 400
``{"message": "JSON parse error: ...", "extra": {}}``.
"""

from __future__ import annotations

import codecs
import json
from typing import Any, Final

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH: Final[int] = 64
"""Deepest nesting of arrays/objects accepted in a request body or WebSocket frame (the
top-level value counts as depth 1). The platform's own documents nest < 10 deep."""


class JSONDepthError(ValueError):
    """The text is not JSON, or nests deeper than allowed (the message says which)."""


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether ``value`` (parsed JSON) nests more than ``max_depth`` containers deep.

    Iterative (no recursion), one visit per container element."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > max_depth:
            return True
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def json_loads_bounded(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, refusing documents nested deeper than ``max_depth``.

    Args:
        text: The JSON document (``bytes`` are decoded as UTF-8 by ``json.loads``).
        max_depth: Most nested arrays/objects allowed; the top-level container is depth 1.
            ``NaN``/``Infinity`` are refused too (strict JSON, as DRF's parser has it).

    Returns:
        The parsed value (dict, list, str, int, float, bool or None).

    Raises:
        JSONDepthError: malformed JSON, or nested deeper than ``max_depth`` (also when the
            parser itself ran out of stack).
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise JSONDepthError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise JSONDepthError(str(exc)) from None
    if isinstance(value, (dict, list)) and _depth_exceeds(value, max_depth):
        raise JSONDepthError(f"nested deeper than {max_depth} levels")
    return value


class BoundedJSONParser(JSONParser):
    """DRF's ``JSONParser`` with :func:`json_loads_bounded`: malformed or too deeply nested
    JSON raises ``ParseError`` (400 in the ``{message, extra}`` shape), never a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        """Parse the request body; raises ``ParseError`` on malformed or too deep JSON."""
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            return json_loads_bounded(text)
        except JSONDepthError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
