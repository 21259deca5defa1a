"""Exposed tool names: the names the model sees for an agent's tools.

Every tool of an agent comes from a source (an MCP server alias, ``builtin``, ``cli``, ...)
and has a name inside that source. Models need one flat namespace that matches the OpenAI
function-name rule ``^[a-zA-Z0-9_-]{1,64}$``. :func:`assign_exposed_names` maps the pairs to
such names:

- tools of a *qualified* source (every MCP server: the caller names them) are always exposed as
  ``<alias>__<tool>`` (``time__get_current_time``), so a tool keeps its name when another
  server is bound or a server adds a tool later: stable names, no surprise renames;
- tools of the platform's own sources (built-in tools...) keep their bare names
  (``web_fetch``) and are qualified only where names collide;
- a name that is too long or still collides is truncated and gets a hash suffix.

No Django imports here: the runner and the capability registry both use it.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Collection, Sequence

MAX_EXPOSED_NAME_LENGTH = 64
"""The OpenAI function-name length limit, in characters."""

EXPOSED_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What every exposed name matches."""

QUALIFIER = "__"
"""Separates the source alias from the tool name in a qualified name."""

_INVALID_CHARS_RE = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_HEX_CHARS = 8


def sanitize_tool_name(name: str) -> str:
    """Replace every character outside ``[a-zA-Z0-9_-]`` with ``_``.

    Args:
        name: Any string (a tool name or a source alias).

    Returns:
        The sanitised string, same length as ``name`` (``"_"`` when ``name`` is empty).
        Not truncated: the length cap is applied by :func:`assign_exposed_names`.
    """
    return _INVALID_CHARS_RE.sub("_", name) or "_"


def qualified_name(alias: str, name: str) -> str:
    """``<alias>__<name>``, both sanitised, not truncated (may exceed 64 characters)."""
    return f"{sanitize_tool_name(alias)}{QUALIFIER}{sanitize_tool_name(name)}"


def _digest(alias: str, name: str, *, salt: int = 0) -> str:
    """Hex digest of ``alias\\0name`` (``alias\\0name\\0salt`` when ``salt`` > 0)."""
    key = f"{alias}\0{name}" if salt == 0 else f"{alias}\0{name}\0{salt}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _hashed(base: str, alias: str, name: str, *, salt: int = 0) -> str:
    """``base`` truncated so that ``base + "_" + 8 hex chars`` fits in 64 characters."""
    suffix = "_" + _digest(alias, name, salt=salt)[:_HASH_HEX_CHARS]
    return base[: MAX_EXPOSED_NAME_LENGTH - len(suffix)] + suffix


def assign_exposed_names(
    tools: Sequence[tuple[str, str]], *, qualified_sources: Collection[str] = ()
) -> dict[tuple[str, str], str]:
    """Choose the name the model sees for each tool of one agent.

    Rules, applied to the de-duplicated set of pairs (so the input order never matters):

    1. Characters outside ``[a-zA-Z0-9_-]`` become ``_``.
    2. First choice: ``<alias>__<name>`` for a tool whose source is in ``qualified_sources``
       (MCP servers), the bare name otherwise. Kept when it is at most 64 characters and no
       other tool of the agent has the same first choice.
    3. A bare-source tool whose first choice collided becomes ``<alias>__<name>``, if that is
       at most 64 characters and collides with nothing else.
    4. Anything left (still colliding, or too long) is truncated and gets ``_`` plus the first
       8 hex characters of ``sha256(alias + "\\0" + name)``, keeping the prefix of its last
       choice. In the astronomically unlikely case that this still collides, a salted digest
       is used instead, processing the pairs in sorted order so the result stays
       deterministic.

    Args:
        tools: ``(source_alias, tool_name)`` pairs for ALL tools of one agent (MCP, built-in,
            CLI, browser...). Duplicated pairs are tolerated and get one name.
        qualified_sources: Source aliases whose tools are always exposed qualified (the
            agent's MCP server aliases).

    Returns:
        ``{(source_alias, tool_name): exposed_name}``; every value matches
        ``^[a-zA-Z0-9_-]{1,64}$`` and the values are pairwise distinct.
    """
    qualified_set = set(qualified_sources)
    pairs = sorted(set(tools))
    first = {
        pair: qualified_name(*pair) if pair[0] in qualified_set else sanitize_tool_name(pair[1]) for pair in pairs
    }
    first_counts = Counter(first.values())

    result: dict[tuple[str, str], str] = {}
    last_choice: dict[tuple[str, str], str] = {}
    colliding_bare: list[tuple[str, str]] = []
    for pair in pairs:
        candidate = first[pair]
        if first_counts[candidate] == 1 and len(candidate) <= MAX_EXPOSED_NAME_LENGTH:
            result[pair] = candidate
        elif first_counts[candidate] > 1 and pair[0] not in qualified_set:
            colliding_bare.append(pair)
        else:
            last_choice[pair] = candidate

    taken = set(result.values())
    second = {pair: qualified_name(*pair) for pair in colliding_bare}
    second_counts = Counter(second.values())
    for pair in colliding_bare:
        candidate = second[pair]
        if (
            second_counts[candidate] == 1
            and candidate not in taken
            and candidate not in first_counts
            and len(candidate) <= MAX_EXPOSED_NAME_LENGTH
        ):
            result[pair] = candidate
        else:
            last_choice[pair] = candidate
    taken = set(result.values())

    # Hashed names: collisions here need a deliberately crafted or astronomically unlucky
    # input; resolve them deterministically (sorted order, salted digest) all the same.
    for pair in sorted(last_choice):
        alias, name = pair
        salt = 0
        candidate = _hashed(last_choice[pair], alias, name)
        while candidate in taken:
            salt += 1
            candidate = _hashed(last_choice[pair], alias, name, salt=salt)
        result[pair] = candidate
        taken.add(candidate)
    return result
