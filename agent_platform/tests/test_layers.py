"""Dependencies point one way, and nobody reaches into another package's or a library's privates.

- The import-linter contracts of ``pyproject.toml`` (``[tool.importlinter]``: the layer order
  of ARCHITECTURE.md, "Layers") hold: ``lint-imports`` is run here so CI enforces them, not
  only ``make lint``.
- No product module (tests and migrations aside) imports a private name (``_x``) or a private
  module of another top-level package or of a third-party library, uses ``module._x`` of a
  module imported from elsewhere, or reads/writes ``obj._x`` where ``_x`` is no attribute the
  project itself defines (then it belongs to a library's object: redis-py's
  ``connection._reader``, httpx's ``transport._pool``, ...). The same holds for a private
  name given as a string to ``getattr``/``hasattr``/``setattr``/``delattr`` (``getattr(client,
  "_session", None)``): the name must be one that the module's own package defines (a string
  alone defines nothing, except in ``__slots__`` or as ``setattr``'s name). :data:`ALLOWED`
  lists the reviewed exceptions, each with its reason.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent_platform", "tenants", "llm", "documents", "capabilities", "agents", "browser", "sessions",
            "console", "frontend", "knowledge", "memory", "evaluation")
"""The project's top-level packages (import-linter's ``root_packages``)."""

ALLOWED: dict[str, str] = {
    "._meta": "Django's Model _meta API is public and documented (docs/ref/models/meta).",
    "._default_manager": "Django documents Model._default_manager (docs/topics/db/managers) for generic code.",
    "os._exit": "The standard library's documented immediate exit (used after a second shutdown signal).",
    "._request": "DRF documents Request._request as the way to the wrapped Django HttpRequest "
                 "(the CSRF check of session-authenticated API calls).",
    "._prefetched_objects_cache": "tenants.api.mixins replaces DRF's UpdateModelMixin.update (to audit the "
                                  "change) and keeps its step: after an update DRF itself empties the instance's "
                                  "prefetch cache exactly so (rest_framework/mixins.py); Django has no public call "
                                  "that drops it without reloading the row.",
}
"""Reviewed exceptions: the offence's key (``module._x`` or ``._x``) and why it is fine."""


def _product_modules() -> list[Path]:
    return sorted(
        path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
        if not {"tests", "migrations"} & set(path.relative_to(ROOT).parts)
    )


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


_ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "hasattr", "setattr", "delattr"})
"""Built-ins that take an attribute's name as a string (their second argument)."""


def _named_attribute(node: ast.AST) -> tuple[str, ast.expr, str] | None:
    """``(function, object, name)`` of a call ``getattr(obj, "name", ...)`` (or ``hasattr``,
    ``setattr``, ``delattr``) whose name is a string literal, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTRIBUTE_FUNCTIONS
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.func.id, node.args[0], node.args[1].value
    return None


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _defined_name(node: ast.AST) -> tuple[str, bool] | None:
    """The name that ``node`` defines, if any, and whether it is written on another object
    than ``self``/``cls`` (``request._x = ...``): a function, a class, an assignment, an
    attribute written or ``setattr``'s name (other strings define nothing)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name, False
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return node.attr, not _is_self(node.value)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return node.id, False
    named = _named_attribute(node)
    if named is not None and named[0] == "setattr":
        return named[2], not _is_self(named[1])
    return None


def _slots(node: ast.AST) -> list[str]:
    """The string entries of a ``__slots__ = (...)`` assignment (empty for any other node)."""
    if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)):
        return []
    return [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _libraries(trees: dict[Path, ast.Module]) -> set[str]:
    """The top-level modules ``trees`` import that are not the project's (libraries, stdlib)."""
    tops = {alias.name.split(".")[0] for tree in trees.values() for node in ast.walk(tree)
            if isinstance(node, ast.Import) for alias in node.names}
    tops |= {node.module.split(".")[0] for tree in trees.values() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    return tops - set(PACKAGES) - {"__future__"}


def _library_private_names(names: set[str], libraries: set[str]) -> set[str]:
    """The ``names`` that one of ``libraries`` keeps on its own objects (``self._x``/``cls._x``
    in its source): Django's ``instance._prefetched_objects_cache``, for one."""
    if not names:
        return set()
    pattern = re.compile(rf"\b(?:self|cls)\.({'|'.join(map(re.escape, sorted(names)))})\b")
    found: set[str] = set()
    for library in sorted(libraries):
        try:
            spec = importlib.util.find_spec(library)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            files = [file for location in spec.submodule_search_locations for file in Path(location).rglob("*.py")]
        else:
            files = [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []
        for file in files:
            found.update(pattern.findall(file.read_text(errors="replace")))
    return found


def _defined_private_names(trees: dict[Path, ast.Module]) -> dict[str, set[str]]:
    """Every ``_x`` the project defines, by top-level package: functions, classes,
    assignments, attributes written, ``__slots__`` entries, ``setattr`` names. A name written
    only on another object (``request._x = ...``) counts unless a library the project imports
    keeps that name on its own objects (then the write reaches into the library's state)."""
    own: dict[str, set[str]] = {}
    elsewhere: dict[str, set[str]] = {}
    for path, tree in trees.items():
        package = path.relative_to(ROOT).parts[0]
        for node in ast.walk(tree):
            defined = [(name, False) for name in _slots(node)]
            if (found := _defined_name(node)) is not None:
                defined.append(found)
            for name, on_another in defined:
                if _private(name):
                    (elsewhere if on_another else own).setdefault(package, set()).add(name)
    written = set().union(*elsewhere.values())
    libraries = _library_private_names(written - set().union(*own.values()), _libraries(trees))
    return {package: own.get(package, set()) | (elsewhere.get(package, set()) - libraries)
            for package in own.keys() | elsewhere.keys()}


def _offences(path: Path, tree: ast.Module, defined_by: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(where, key)`` of every private access in ``tree`` (``key`` is matched against ALLOWED).

    ``defined_by``: :func:`_defined_private_names` (an attribute ``obj._x`` is fine if any
    package of the project defines ``_x``; a ``getattr(obj, "_x")`` only if the module's own
    package does)."""
    own = path.relative_to(ROOT).parts[0]
    defined = set().union(*defined_by.values())
    where = str(path.relative_to(ROOT))
    found: list[tuple[str, str]] = []
    imported_from: dict[str, str] = {}  # local name -> top-level package it came from
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                imported_from[alias.asname or top] = top
                if top != own and any(_private(part) for part in alias.name.split(".")[1:]):
                    found.append((f"{where}:{node.lineno}", f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            top = node.module.split(".")[0]
            for alias in node.names:
                imported_from[alias.asname or alias.name] = top
            if top == own:
                continue
            if any(_private(part) for part in node.module.split(".")[1:]):
                found.append((f"{where}:{node.lineno}", f"from {node.module} import"))
            found += [(f"{where}:{node.lineno}", f"from {node.module} import {alias.name}")
                      for alias in node.names if _private(alias.name)]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Name) and imported_from.get(value.id, own) != own:
            found.append((f"{where}:{node.lineno}", f"{value.id}.{node.attr}"))
        elif node.attr not in defined:
            found.append((f"{where}:{node.lineno}", f".{node.attr}"))
    for node in ast.walk(tree):
        named = _named_attribute(node)
        if named is None or not _private(named[2]):
            continue
        function, value, name = named
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Name) and imported_from.get(value.id, own) != own:
            found.append((f"{where}:{node.lineno}", f"{function}({value.id}, {name!r})"))
        elif name not in defined_by.get(own, set()):
            found.append((f"{where}:{node.lineno}", f"{function}(., {name!r})"))
    return found


def _allowed(key: str) -> bool:
    """``key`` is allowed itself, or is ``name._x`` with ``._x`` allowed (``Tenant._meta``),
    or ``getattr(name, '_x')`` (or ``hasattr``, ...) with ``._x`` allowed."""
    if key in ALLOWED:
        return True
    if named := re.fullmatch(r"\w+\(.*, '(\w+)'\)", key):
        return "." + named[1] in ALLOWED
    return not key.startswith(("from ", "import ")) and "." + key.rsplit(".", 1)[-1] in ALLOWED


def test_import_contracts_hold() -> None:
    """``lint-imports`` (import-linter) passes: every contract of ``[tool.importlinter]`` is kept.

    Fails, for instance, when a tool imports ``sessions`` again instead of using its
    ``ToolContext.store`` (capabilities sits below sessions).
    """
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_private_name_of_another_package_or_library_is_used() -> None:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in _product_modules()}
    defined = _defined_private_names(trees)
    offenders = [
        f"{where}: {key}" for path, tree in trees.items() for where, key in _offences(path, tree, defined)
        if not _allowed(key)
    ]
    assert offenders == []


def _self_private_names(cls_node: ast.ClassDef) -> set[str]:
    """Every ``self._x`` / ``cls._x`` a class body reads or writes, and its ``_x`` class attributes."""
    names = {node.attr for node in ast.walk(cls_node)
             if isinstance(node, ast.Attribute) and _private(node.attr)
             and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")}
    names |= {target.id for stmt in cls_node.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
              for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
              if isinstance(target, ast.Name) and _private(target.id)}
    return names


SUBCLASS_ALLOWED: dict[str, str] = {
    "django.db.models.manager.BaseManager._db": "Django's custom-manager docs build querysets with "
                                                "QuerySet(self.model, using=self._db).",
}
"""Reviewed exceptions of the base-class check, each with its reason."""


def _class_source(cls: type) -> str:
    """The source of ``cls``'s own functions (found through their code objects: a class whose
    ``__module__`` is rewritten, as httpx's are, still has its functions' files)."""
    parts = []
    for value in vars(cls).values():
        function = getattr(value, "__func__", value)
        function = getattr(function, "fget", function)
        if inspect.isfunction(function):
            try:
                parts.append(inspect.getsource(function))
            except (OSError, TypeError):
                continue
    return "\n".join(parts)


def _library_privates_used_by(cls: type, names: set[str]) -> list[str]:
    """The ``names`` that a third-party base class of ``cls`` itself uses (its private state)."""
    used = []
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] in PACKAGES or base.__module__ == "builtins":
            continue
        source = _class_source(base)
        used += [f"{base.__module__}.{base.__qualname__}.{name}" for name in sorted(names)
                 if name in vars(base) or re.search(rf"\b(self|cls)\.{re.escape(name)}\b", source)]
    return [key for key in used if key not in SUBCLASS_ALLOWED]


def test_no_subclass_touches_a_library_base_class_private_state() -> None:
    """A subclass of a library's class uses no ``self._x`` that the library's class uses itself.

    Replacing ``httpx.AsyncHTTPTransport._pool`` (how ``capabilities.netsafe`` once gave httpx
    a network backend) is such an access: it breaks silently when the library changes.
    """
    offenders = []
    for path in _product_modules():
        tree = ast.parse(path.read_text(), str(path))
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.bases]
        if not classes:
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for node in classes:
            cls = getattr(module, node.name, None)
            names = _self_private_names(node)
            if isinstance(cls, type) and names:
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {used}"
                              for used in _library_privates_used_by(cls, names)]
    assert offenders == []


def test_the_base_class_check_sees_a_replaced_library_attribute() -> None:
    import httpx

    source = "class T(httpx.AsyncHTTPTransport):\n    def __init__(self):\n        self._pool = None\n"
    names = _self_private_names(ast.parse(source).body[0])
    assert _library_privates_used_by(type("T", (httpx.AsyncHTTPTransport,), {}), names) == [
        "httpx.AsyncHTTPTransport._pool"]


@pytest.mark.parametrize(("source", "expected"), [
    ("from tenants.admin_scoping import _admin_tenants\n", ["from tenants.admin_scoping import _admin_tenants"]),
    ("from redis._parsers import Encoder\n", ["from redis._parsers import"]),
    ("import httpx._transports.default\n", ["import httpx._transports.default"]),
    ("from llm.providers import openai_compat as impl\nimpl._new_client(1)\n", ["impl._new_client"]),
    ("def f(connection):\n    return connection._reader\n", ["._reader"]),
    ("class T:\n    def __init__(self):\n        self._mine = 1\n\ndef f(t):\n    return t._mine\n", []),
    ("from capabilities.tools import ToolContext\nfrom sessions.models import _x\n", []),  # own package
])
def test_the_private_name_check_sees_each_kind_of_offence(source: str, expected: list[str]) -> None:
    """The checker itself: each kind of reach into another package's privates is reported."""
    path = ROOT / "sessions" / "example.py"
    tree = ast.parse(source)
    keys = [key for _, key in _offences(path, tree, _defined_private_names({path: tree}))]
    assert keys == expected


@pytest.mark.parametrize(("source", "expected"), [
    # The pool once read the mcp SDK's state this way (issue 35).
    ("def f(client):\n    s = getattr(client, '_session', None)\n    return getattr(s, '_dispatcher', None)\n",
     ["getattr(., '_session')", "getattr(., '_dispatcher')"]),
    ("def f(conn):\n    return hasattr(conn, '_reader')\n", ["hasattr(., '_reader')"]),
    ("import redis\ndef f():\n    return getattr(redis, '_compat')\n", ["getattr(redis, '_compat')"]),
    ("def f(conn):\n    setattr(conn, '_x', 1)\n    delattr(conn, '_x')\n", []),  # its own attribute
    ("def f(request):\n    request._seen = 1\n    return getattr(request, '_seen', None)\n", []),
    ("class T:\n    def f(self):\n        return getattr(self, '_anything', None)\n", []),
    ("def f(obj):\n    return getattr(obj, 'public', None), getattr(obj, '__dict__')\n", []),
    ("def f(obj):\n    return getattr(obj, '_x', None), getattr(obj, '_x', None)\n",  # a read defines nothing
     ["getattr(., '_x')", "getattr(., '_x')"]),
    # Written on another object, but Django keeps that name on its model instances: its state.
    ("from django.db import models\ndef f(instance):\n    if getattr(instance, '_prefetched_objects_cache', None):\n"
     "        instance._prefetched_objects_cache = {}\n",
     ["._prefetched_objects_cache", "getattr(., '_prefetched_objects_cache')"]),
])
def test_the_private_name_check_sees_a_private_name_given_as_a_string(source: str, expected: list[str]) -> None:
    path = ROOT / "sessions" / "example.py"
    tree = ast.parse(source)
    keys = [key for _, key in _offences(path, tree, _defined_private_names({path: tree}))]
    assert keys == expected


def test_a_private_name_another_package_defines_is_not_the_getattr_callers() -> None:
    """``getattr(obj, "_x")`` in ``sessions`` when only ``capabilities`` defines ``_x``: flagged."""
    owner, reader = ROOT / "capabilities" / "a.py", ROOT / "sessions" / "b.py"
    trees = {owner: ast.parse("class A:\n    def __init__(self):\n        self._x = 1\n"),
             reader: ast.parse("def f(a):\n    return getattr(a, '_x'), a._x\n")}
    keys = [key for _, key in _offences(reader, trees[reader], _defined_private_names(trees))]
    assert keys == ["getattr(., '_x')"]
