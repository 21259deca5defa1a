"""The model layer's imports point one way: llm imports nothing of the packages above it
(capabilities, agents, sessions, browser, console, frontend), no provider adapter imports the
router, and no module imports a private module or name of a third-party library (such as the
openai SDK's vendored ``openai._vendor`` aiohttp transport)."""

from __future__ import annotations

import ast
from pathlib import Path

LLM = Path(__file__).resolve().parents[1]
ABOVE = {"capabilities", "agents", "sessions", "browser", "console", "frontend", "documents", "agent_platform"}


def _imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of every import in ``path`` (TYPE_CHECKING and function bodies too)."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


PRESENTATION = {"admin.py"}
"""The Django admin pages: presentation (they use the console's helpers); nothing in the
model layer imports them."""


def _product_modules(root: Path = LLM) -> list[Path]:
    return [
        p for p in root.rglob("*.py")
        if "tests" not in p.relative_to(root).parts and "migrations" not in p.parts and p.name not in PRESENTATION
    ]


def test_llm_imports_nothing_from_the_layers_above_it() -> None:
    offenders = [
        f"{path.relative_to(LLM.parent)}: {module}"
        for path in _product_modules() for module, _ in _imports(path) if module.split(".")[0] in ABOVE
    ]
    assert offenders == []


def test_no_provider_adapter_imports_the_router() -> None:
    offenders = [
        f"{path.name}: {module}"
        for path in (LLM / "providers").glob("*.py") for module, names in _imports(path)
        if module == "llm.router" or (module == "llm" and "router" in names)
    ]
    assert offenders == []


def test_no_private_third_party_module_or_name_is_imported() -> None:
    offenders = []
    for path in _product_modules():
        for module, names in _imports(path):
            if module.split(".")[0] == "llm" or module == "__future__":
                continue
            private_module = any(part.startswith("_") for part in module.split(".")[1:])
            private_names = [n for n in names if n.startswith("_")]
            if private_module or private_names:
                offenders.append(f"{path.relative_to(LLM.parent)}: {module} {private_names or ''}")
    assert offenders == []


def test_no_private_attribute_of_another_object_is_used() -> None:
    """``x._name`` only on ``self``/``cls``: no reaching into an SDK client, an httpx2 transport
    or an aiohttp response (the SDK's vendored transport, ``_make_status_error_from_response``
    and httpx2's ``_pool`` were used so before)."""
    offenders = []
    for path in _product_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            offenders.append(f"{path.relative_to(LLM.parent)}:{node.lineno} .{node.attr}")
    assert offenders == []
