"""Exposed tool names: the names the model sees for an agent's tools.

Every tool of an agent comes from a source (an MCP server alias, ``builtin``, ``cli``, ...)
and has a name inside that source. Models need one flat namespace that matches the OpenAI
function-name rule ``^[a-zA-Z0-9_-]{1,64}$``. :func:`assign_exposed_names` maps the pairs to
such names, preferring the bare tool name (small local models call ``get_current_time`` far
more reliably than ``time__get_current_time``) and qualifying only where names collide.

No Django imports here: the runner and the capability registry both use it.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence

MAX_EXPOSED_NAME_LENGTH = 64
"""The OpenAI function-name length limit, in characters."""

EXPOSED_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What every exposed name matches."""

_INVALID_CHARS_RE = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_HEX_CHARS = 8
_QUALIFIER = "__"


def sanitize_tool_name(name: str) -> str:
    """Replace every character outside ``[a-zA-Z0-9_-]`` with ``_``.

    Args:
        name: Any string (a tool name or a source alias).

    Returns:
        The sanitised string, same length as ``name`` (``"_"`` when ``name`` is empty).
        Not truncated: the length cap is applied by :func:`assign_exposed_names`.
    """
    return _INVALID_CHARS_RE.sub("_", name) or "_"


def _digest(alias: str, name: str, *, salt: int = 0) -> str:
    """Hex digest of ``alias\\0name`` (``alias\\0name\\0salt`` when ``salt`` > 0)."""
    key = f"{alias}\0{name}" if salt == 0 else f"{alias}\0{name}\0{salt}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _hashed(base: str, alias: str, name: str, *, salt: int = 0) -> str:
    """``base`` truncated so that ``base + "_" + 8 hex chars`` fits in 64 characters."""
    suffix = "_" + _digest(alias, name, salt=salt)[:_HASH_HEX_CHARS]
    return base[: MAX_EXPOSED_NAME_LENGTH - len(suffix)] + suffix


def assign_exposed_names(tools: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Choose the name the model sees for each tool of one agent.

    Rules, applied to the de-duplicated set of pairs (so the input order never matters):

    1. Characters outside ``[a-zA-Z0-9_-]`` become ``_``.
    2. A tool whose sanitised name is unique among all the agent's tools, and at most 64
       characters, keeps that bare name.
    3. Tools whose sanitised names collide all become ``<alias>__<name>`` (both sanitised),
       if that is at most 64 characters and collides with nothing else.
    4. Anything left (still colliding, or too long) is truncated and gets ``_`` plus the first
       8 hex characters of ``sha256(alias + "\\0" + name)``: a unique-but-long bare name keeps
       its bare prefix, a colliding one its qualified prefix. In the astronomically unlikely
       case that this still collides, a salted digest is used instead, processing the pairs
       in sorted order so the result stays deterministic.

    Args:
        tools: ``(source_alias, tool_name)`` pairs for ALL tools of one agent (MCP, built-in,
            CLI, browser...). Duplicated pairs are tolerated and get one name.

    Returns:
        ``{(source_alias, tool_name): exposed_name}``; every value matches
        ``^[a-zA-Z0-9_-]{1,64}$`` and the values are pairwise distinct.
    """
    pairs = sorted(set(tools))
    bare = {pair: sanitize_tool_name(pair[1]) for pair in pairs}
    bare_counts = Counter(bare.values())

    result: dict[tuple[str, str], str] = {}
    pending_long: list[tuple[str, str]] = []
    colliding: list[tuple[str, str]] = []
    for pair in pairs:
        candidate = bare[pair]
        if bare_counts[candidate] > 1:
            colliding.append(pair)
        elif len(candidate) > MAX_EXPOSED_NAME_LENGTH:
            pending_long.append(pair)
        else:
            result[pair] = candidate

    taken = set(result.values())
    qualified = {pair: f"{sanitize_tool_name(pair[0])}{_QUALIFIER}{bare[pair]}" for pair in colliding}
    qualified_counts = Counter(qualified.values())
    hashed_base: dict[tuple[str, str], str] = {pair: bare[pair] for pair in pending_long}
    for pair in colliding:
        candidate = qualified[pair]
        if (
            qualified_counts[candidate] == 1
            and candidate not in taken
            and len(candidate) <= MAX_EXPOSED_NAME_LENGTH
        ):
            result[pair] = candidate
        else:
            hashed_base[pair] = candidate
    taken = set(result.values())

    # Hashed names: collisions here need a deliberately crafted or astronomically unlucky
    # input; resolve them deterministically (sorted order, salted digest) all the same.
    for pair in sorted(hashed_base):
        alias, name = pair
        salt = 0
        candidate = _hashed(hashed_base[pair], alias, name)
        while candidate in taken:
            salt += 1
            candidate = _hashed(hashed_base[pair], alias, name, salt=salt)
        result[pair] = candidate
        taken.add(candidate)
    return result
