"""Tests for capabilities.naming.assign_exposed_names (pure functions, no Django)."""

from __future__ import annotations

import hashlib
import random
import re

import pytest

from capabilities.naming import assign_exposed_names, sanitize_tool_name

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _check_invariants(tools: list[tuple[str, str]], names: dict[tuple[str, str], str]) -> None:
    assert set(names) == set(tools)
    assert all(NAME_RE.match(name) for name in names.values()), names
    assert len(set(names.values())) == len(names), "exposed names must be unique"


def _hash8(alias: str, name: str) -> str:
    return hashlib.sha256(f"{alias}\0{name}".encode()).hexdigest()[:8]


def test_unique_names_stay_bare() -> None:
    tools = [("time", "get_current_time"), ("time", "convert_time"), ("builtin", "web_search")]
    names = assign_exposed_names(tools)
    assert names == {
        ("time", "get_current_time"): "get_current_time",
        ("time", "convert_time"): "convert_time",
        ("builtin", "web_search"): "web_search",
    }


def test_colliding_names_all_get_qualified() -> None:
    tools = [("github", "search"), ("gitlab", "search"), ("time", "get_current_time")]
    names = assign_exposed_names(tools)
    assert names == {
        ("github", "search"): "github__search",
        ("gitlab", "search"): "gitlab__search",
        ("time", "get_current_time"): "get_current_time",
    }


def test_collision_after_sanitising() -> None:
    # "read.file" and "read file" both sanitise to "read_file": both are qualified.
    tools = [("fs", "read.file"), ("docs", "read file"), ("fs", "write-file")]
    names = assign_exposed_names(tools)
    assert names[("fs", "read.file")] == "fs__read_file"
    assert names[("docs", "read file")] == "docs__read_file"
    assert names[("fs", "write-file")] == "write-file"
    _check_invariants(tools, names)


def test_sanitising_replaces_every_invalid_character() -> None:
    assert sanitize_tool_name("a.b/c d:é€") == "a_b_c_d___"
    assert sanitize_tool_name("") == "_"
    tools = [("srv", "weather/forecast v2"), ("srv", "")]
    names = assign_exposed_names(tools)
    assert names[("srv", "weather/forecast v2")] == "weather_forecast_v2"
    assert names[("srv", "")] == "_"
    _check_invariants(tools, names)


def test_qualified_name_colliding_with_a_bare_name_is_hashed() -> None:
    # The bare name "a__x" is unique, so it stays; ("a", "x") would qualify to "a__x" too.
    tools = [("a", "x"), ("b", "x"), ("c", "a__x")]
    names = assign_exposed_names(tools)
    assert names[("c", "a__x")] == "a__x"
    assert names[("b", "x")] == "b__x"
    assert names[("a", "x")] == f"a__x_{_hash8('a', 'x')}"
    _check_invariants(tools, names)


def test_qualified_names_colliding_with_each_other_are_hashed() -> None:
    # Aliases "a.b" and "a_b" sanitise alike, so their qualified names collide as well.
    tools = [("a.b", "run"), ("a_b", "run")]
    names = assign_exposed_names(tools)
    assert names[("a.b", "run")] == f"a_b__run_{_hash8('a.b', 'run')}"
    assert names[("a_b", "run")] == f"a_b__run_{_hash8('a_b', 'run')}"
    _check_invariants(tools, names)


def test_long_unique_name_is_truncated_with_hash() -> None:
    long_name = "x" * 100
    names = assign_exposed_names([("srv", long_name), ("srv", "short")])
    exposed = names[("srv", long_name)]
    assert len(exposed) == 64
    assert exposed == "x" * 55 + "_" + _hash8("srv", long_name)
    assert names[("srv", "short")] == "short"


def test_long_colliding_names_are_truncated_with_hash() -> None:
    name = "n" * 60  # bare fits, but it collides and "<alias>__" + 60 chars does not fit
    tools = [("alpha", name), ("beta", name)]
    names = assign_exposed_names(tools)
    assert names[("alpha", name)] == ("alpha__" + name)[:55] + "_" + _hash8("alpha", name)
    assert names[("beta", name)] == ("beta__" + name)[:55] + "_" + _hash8("beta", name)
    _check_invariants(tools, names)


def test_exactly_64_chars_is_kept() -> None:
    name = "y" * 64
    assert assign_exposed_names([("s", name)]) == {("s", name): name}


def test_duplicate_pairs_get_one_name() -> None:
    names = assign_exposed_names([("s", "t"), ("s", "t")])
    assert names == {("s", "t"): "t"}


def test_empty_input() -> None:
    assert assign_exposed_names([]) == {}


def _messy_tools() -> list[tuple[str, str]]:
    tools = [
        ("time", "get_current_time"),
        ("time2", "get_current_time"),
        ("github", "search"),
        ("gitlab", "search"),
        ("builtin", "search"),
        ("a", "x"),
        ("b", "x"),
        ("c", "a__x"),
        ("a.b", "run"),
        ("a_b", "run"),
        ("fs", "read.file"),
        ("docs", "read file"),
        ("srv", "z" * 80),
        ("srv", "z" * 81),
        ("one", "q" * 63),
        ("two", "q" * 63),
        ("unicode", "überprüfen"),
        ("unicode2", "überprüfen"),
    ]
    tools += [(f"s{i}", f"tool_{i % 7}") for i in range(30)]
    return tools


@pytest.mark.parametrize("seed", range(20))
def test_result_does_not_depend_on_input_order(seed: int) -> None:
    tools = _messy_tools()
    expected = assign_exposed_names(tools)
    shuffled = tools[:]
    random.Random(seed).shuffle(shuffled)
    assert assign_exposed_names(shuffled) == expected
    _check_invariants(tools, expected)


def test_uniqueness_under_many_random_inputs() -> None:
    rng = random.Random(1234)
    alphabet = "ab._- /x"
    for _ in range(300):
        tools = [
            ("".join(rng.choice("ab._") for _ in range(rng.randint(1, 3))),
             "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 70))))
            for _ in range(rng.randint(1, 25))
        ]
        names = assign_exposed_names(tools)
        _check_invariants(tools, names)


# --- MCP servers: qualified sources are always exposed as <alias>__<tool> -------------------


def test_mcp_tools_are_always_qualified_and_builtins_stay_bare() -> None:
    tools = [("time", "get_current_time"), ("time", "convert_time"), ("builtin", "web_fetch")]
    names = assign_exposed_names(tools, qualified_sources={"time"})
    assert names == {
        ("time", "get_current_time"): "time__get_current_time",
        ("time", "convert_time"): "time__convert_time",
        ("builtin", "web_fetch"): "web_fetch",
    }


def test_mcp_names_do_not_change_when_another_server_is_bound() -> None:
    alone = assign_exposed_names([("github", "search")], qualified_sources={"github"})
    together = assign_exposed_names([("github", "search"), ("gitlab", "search")], qualified_sources={"github", "gitlab"})
    assert alone[("github", "search")] == together[("github", "search")] == "github__search"
    assert together[("gitlab", "search")] == "gitlab__search"


def test_builtin_colliding_with_a_qualified_mcp_name_both_move() -> None:
    # A built-in literally named "time__now" and the MCP tool (time, now): both first choices
    # are "time__now"; the built-in qualifies to "builtin__time__now", the MCP one is hashed.
    tools = [("builtin", "time__now"), ("time", "now")]
    names = assign_exposed_names(tools, qualified_sources={"time"})
    assert names[("builtin", "time__now")] == "builtin__time__now"
    assert names[("time", "now")] == f"time__now_{_hash8('time', 'now')}"
    _check_invariants(tools, names)


def test_long_mcp_name_is_truncated_with_hash() -> None:
    name = "t" * 70
    names = assign_exposed_names([("srv", name)], qualified_sources={"srv"})
    assert names[("srv", name)] == ("srv__" + name)[:55] + "_" + _hash8("srv", name)


def test_mcp_aliases_that_sanitise_alike_are_hashed() -> None:
    tools = [("a.b", "run"), ("a_b", "run")]
    names = assign_exposed_names(tools, qualified_sources={"a.b", "a_b"})
    assert names[("a.b", "run")] == f"a_b__run_{_hash8('a.b', 'run')}"
    assert names[("a_b", "run")] == f"a_b__run_{_hash8('a_b', 'run')}"


@pytest.mark.parametrize("seed", range(5))
def test_qualified_result_does_not_depend_on_input_order(seed: int) -> None:
    tools = _messy_tools()
    qualified = {alias for alias, _ in tools if alias != "builtin"}
    expected = assign_exposed_names(tools, qualified_sources=qualified)
    shuffled = tools[:]
    random.Random(seed).shuffle(shuffled)
    assert assign_exposed_names(shuffled, qualified_sources=qualified) == expected
    _check_invariants(tools, expected)
