"""No import cycle between the modules of ``sessions``, ``capabilities``, ``knowledge`` and ``memory``.

A cycle is a set of modules that import each other, directly or through others (a strongly
connected component of the import graph with more than one module). Inside a cycle no module
can be understood, tested or changed without the others, and a lazy import is usually what
hides it (ARCHITECTURE.md, "Layers": a lower module that needs a higher one declares a port and
the higher one fills it).

What counts as an import: every ``import`` statement that runs, at module level **or inside a
function** (a lazy import is a dependency all the same; grimp sees both). Imports under
``if TYPE_CHECKING:`` do not count here: they never run, so they cannot make a module depend
on another's import order (the import-linter contracts in pyproject.toml still count them).
Tests and migrations are left out.

:data:`KNOWN_CYCLES` lists the cycles not broken yet; it may only shrink. The test fails on any
cycle not listed (a new one, or a listed one that grew) and on a listed cycle that no longer
exists (so the list stays true: remove it). Running this module prints every cycle with one
closed chain of imports through it and the lines that make them.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sessions", "capabilities", "knowledge", "memory")

KNOWN_CYCLES: tuple[frozenset[str], ...] = ()
"""Cycles that exist and are to be broken (each the set of its modules, with what closes it).
Only shrinks: a cycle broken is removed from here (the test says so)."""


def import_graph() -> grimp.ImportGraph:
    """The import graph of :data:`PACKAGES` without TYPE_CHECKING imports, tests and migrations."""
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    for module in list(graph.modules):
        if {"tests", "migrations"} & set(module.split(".")):
            graph.remove_module(module)
    return graph


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components of the graph ``edges`` (module → modules it imports)
    with more than one module: Tarjan's algorithm, iterative (no recursion limit), in a stable
    order (by each component's smallest module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return sorted(found, key=min)


def import_cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The cycles of ``graph`` (its strongly connected components of more than one module)."""
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    return strongly_connected(edges)


def describe(graph: grimp.ImportGraph, cycle: frozenset[str]) -> str:
    """``cycle`` as text: its modules, then one closed chain through its first module with the
    line of each import (``a:12 imports b``)."""
    start = min(cycle)
    inside = {m: [n for n in graph.find_modules_directly_imported_by(m) if n in cycle] for m in cycle}
    chain = _shortest_return(inside, start)
    lines = [f"{len(cycle)} modules: {', '.join(sorted(cycle))}", "  one chain:"]
    for importer, imported in zip(chain, chain[1:], strict=False):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = ", ".join(f"line {d['line_number']}: {d['line_contents'].strip()}" for d in details[:2])
        lines.append(f"    {importer} -> {imported}   ({where})")
    return "\n".join(lines)


def _shortest_return(edges: Mapping[str, list[str]], start: str) -> list[str]:
    """The shortest path ``start → … → start`` along ``edges`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(edges[node]):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if succ not in came_from:
                    came_from[succ] = node
                    following.append(succ)
        frontier = following
    return [start]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return import_graph()


def test_no_import_cycle_outside_the_known_list(graph: grimp.ImportGraph) -> None:
    cycles = import_cycles(graph)
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    report = "\n\n".join(describe(graph, c) for c in new)
    assert not new, f"import cycles (break them: inject the dependency through a port, don't hide it):\n{report}"


def test_every_known_cycle_still_exists(graph: grimp.ImportGraph) -> None:
    cycles = set(import_cycles(graph))
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"these cycles are broken (or changed): remove them from KNOWN_CYCLES: {gone}"


def test_the_cycle_finder_finds_cycles_and_only_cycles() -> None:
    """Not vacuous: a two-module and a three-module cycle are found, with a module that only
    imports into one of them and a self-import left out."""
    edges = {"a": ["b"], "b": ["a", "c"], "c": ["d"], "d": ["e"], "e": ["c"], "f": ["a", "f"], "g": []}
    assert strongly_connected(edges) == [frozenset({"a", "b"}), frozenset({"c", "d", "e"})]
    assert _shortest_return({"c": ["d"], "d": ["e"], "e": ["c"]}, "c") == ["c", "d", "e", "c"]


def test_the_graph_sees_imports_inside_functions(graph: grimp.ImportGraph) -> None:
    """Lazy imports count: ``sessions.tasks.run_execute`` imports the runner inside the function."""
    assert graph.direct_import_exists(importer="sessions.tasks", imported="sessions.runner.loop")


def _layer_modules(contract_id: str) -> set[str]:
    """The modules named by the layers of import-linter contract ``contract_id`` (pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == contract_id]
    return {name.strip() for layer in contract["layers"] for name in re.split(r"[|:]", layer) if name.strip()}


def test_every_module_of_sessions_is_in_a_layer(graph: grimp.ImportGraph) -> None:
    """The ``sessions-layers`` contract names every module of ``sessions`` (itself or a package
    above it), so a new module is placed in the layer order, not left unchecked."""
    named = _layer_modules("sessions-layers")
    packages = {"sessions", "sessions.runner"}  # packages whose __init__ holds no code of a layer
    unplaced = sorted(
        module for module in graph.modules
        if module.startswith("sessions.") and module not in packages
        and not any(module == name or module.startswith(f"{name}.") for name in named)
    )
    assert not unplaced, f"modules of sessions in no layer of the sessions-layers contract (pyproject.toml): {unplaced}"


if __name__ == "__main__":
    built = import_graph()
    for found in import_cycles(built):
        known = " (known)" if found in KNOWN_CYCLES else ""
        print(describe(built, found) + known + "\n")  # noqa: T201
