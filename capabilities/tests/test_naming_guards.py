"""Exposed names at their edges (issue 24; what mutation testing of capabilities/naming.py
found untested): the 64-character boundary, a bare tool named like a qualified source, and
the hashed names' collision path (a salted digest), with collisions crafted on purpose.

Expected names are computed here from the documented rule (``sha256(alias + "\\0" + name)``,
its first 8 hex characters, ``"\\0" + salt`` appended to the key when salted), not read back
from the code.
"""

from __future__ import annotations

import hashlib
import itertools

import pytest

from capabilities.naming import MAX_EXPOSED_NAME_LENGTH, assign_exposed_names

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.usefixtures("all_tenants_scope"),
]  # a salt that never changes the name loops forever

SUFFIX_CHARS = 1 + 8  # "_" + 8 hex characters


def digest8(alias: str, name: str, salt: int = 0) -> str:
    key = f"{alias}\0{name}" if salt == 0 else f"{alias}\0{name}\0{salt}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:8]


def hashed(base: str, alias: str, name: str, salt: int = 0) -> str:
    return base[: MAX_EXPOSED_NAME_LENGTH - SUFFIX_CHARS] + "_" + digest8(alias, name, salt)


def test_names_of_exactly_64_characters_are_kept_and_65_are_hashed():
    """Mutation: ``len(candidate) < MAX_EXPOSED_NAME_LENGTH`` (a 64-character name hashed)."""
    bare64, bare65 = "a" * 64, "b" * 65
    names = assign_exposed_names([("builtin", bare64), ("builtin", bare65)])
    assert names[("builtin", bare64)] == bare64
    assert names[("builtin", bare65)] == hashed(bare65, "builtin", bare65)
    tool = "t" * (64 - len("srv__"))  # qualified: exactly 64 characters
    assert assign_exposed_names([("srv", tool)], qualified_sources={"srv"})[("srv", tool)] == "srv__" + tool


def test_colliding_bare_tools_keep_a_qualified_name_of_exactly_64_characters():
    """Mutation: ``len(candidate) < MAX_EXPOSED_NAME_LENGTH`` in the second choice (the
    64-character ``builtin__…`` would be hashed)."""
    tool = "c" * (64 - len("builtin__"))
    names = assign_exposed_names([("builtin", tool), ("cli", tool)])
    assert names == {("builtin", tool): "builtin__" + tool, ("cli", tool): "cli__" + tool}
    longer = tool + "c"
    names = assign_exposed_names([("builtin", longer), ("cli", longer)])
    assert names[("builtin", longer)] == hashed("builtin__" + longer, "builtin", longer)


def test_a_long_qualified_name_is_cut_and_gets_the_documented_digest():
    tool = "x" * 80
    names = assign_exposed_names([("srv", tool)], qualified_sources={"srv"})
    assert names[("srv", tool)] == hashed("srv__" + tool, "srv", tool)
    assert len(names[("srv", tool)]) == MAX_EXPOSED_NAME_LENGTH


def test_bare_tools_named_like_a_qualified_source_are_qualified_when_they_collide():
    """Mutation: ``pair[1] not in qualified_set`` for ``pair[0]`` (the colliding bare tools,
    named like the MCP alias ``srv``, would get hashed names instead of ``<alias>__srv``)."""
    names = assign_exposed_names([("builtin", "srv"), ("cli", "srv"), ("srv", "get")], qualified_sources={"srv"})
    assert names == {("builtin", "srv"): "builtin__srv", ("cli", "srv"): "cli__srv", ("srv", "get"): "srv__get"}


def test_a_hashed_name_taken_by_another_tool_gets_a_salted_digest():
    """A bare tool is named exactly what another tool's hashed name would be: the hashed one
    takes the salted digest (salt 1). Mutations: the salt ignored (``_digest`` unsalted, or
    ``_hashed`` not passing it: an endless loop, cut by the test's timeout), the salt counted
    wrong (starts at 1, ``-= 1``, ``+= 2``), the base or the pair left out of the retry."""
    long_tool = "z" * 80
    squatter = hashed("srv__" + long_tool, "srv", long_tool)
    names = assign_exposed_names([("srv", long_tool), ("builtin", squatter)], qualified_sources={"srv"})
    assert names[("builtin", squatter)] == squatter
    assert names[("srv", long_tool)] == hashed("srv__" + long_tool, "srv", long_tool, salt=1)
    # Twice: salt 2 (the salted name is taken as well).
    salted = hashed("srv__" + long_tool, "srv", long_tool, salt=1)
    names = assign_exposed_names([("srv", long_tool), ("builtin", squatter), ("cli", salted)],
                                 qualified_sources={"srv"})
    assert names[("srv", long_tool)] == hashed("srv__" + long_tool, "srv", long_tool, salt=2)
    assert len(set(names.values())) == 3


def _two_long_names_with_one_digest_prefix() -> tuple[str, str]:
    """Two 80-character tool names of one source whose hashed names are equal: same first 55
    characters, and the same first 8 hex characters of their digests (a birthday search,
    about 2**16 hashes)."""
    seen: dict[str, str] = {}
    for i in itertools.count():
        name = "q" * 70 + f"{i:010d}"
        prefix = digest8("srv", name)
        if prefix in seen:
            return seen[prefix], name
        seen[prefix] = name
    raise AssertionError("unreachable")


def test_two_hashed_names_that_collide_still_get_distinct_names():
    """Mutation: ``taken.add(None)`` (the second of two colliding hashed names would repeat
    the first: two tools with one exposed name)."""
    first, second = _two_long_names_with_one_digest_prefix()
    assert hashed("srv__" + first, "srv", first) == hashed("srv__" + second, "srv", second)
    names = assign_exposed_names([("srv", second), ("srv", first)], qualified_sources={"srv"})
    earlier, later = sorted([first, second])
    assert names[("srv", earlier)] == hashed("srv__" + earlier, "srv", earlier)
    assert names[("srv", later)] == hashed("srv__" + later, "srv", later, salt=1)
