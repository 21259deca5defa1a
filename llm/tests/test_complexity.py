"""Complexity guard (issue 24): every function of the fallback router and of the model-layer
modules around it stays under radon cyclomatic complexity 15 (radon grade C starts at 11;
``Router.stream`` was 27 before it was split into steps).

The provider adapters are held to the same limit, except for the functions named in
``NOT_YET_SPLIT`` (each with the complexity it had when listed); that list must match what radon
finds exactly, so a new complex function fails, and so does one that was split but is still
listed."""

from __future__ import annotations

from pathlib import Path

import pytest
from radon.complexity import cc_visit
from radon.visitors import Class

LLM = Path(__file__).resolve().parents[1]
LIMIT = 15
MODULES = ["router.py", "model.py", "config.py", "records.py", "providers/__init__.py",
           "providers/aiohttp_transport.py", "providers/openai_compat.py", "providers/anthropic.py"]
NOT_YET_SPLIT: dict[str, dict[str, int]] = {
    # Split so far: openai_compat ``_stream`` (36; per-read state object), anthropic
    # ``stream_chat`` (25; per-event state object), ``_class_of`` (24) and
    # ``classify_anthropic_error`` (24; wording, status and non-SDK errors apart),
    # ``_ToolCallAssembler.add`` (22; finding the call apart), ``build_request`` (20; tool params apart),
    # ``_sse_payloads`` (27; the event decoding apart, ``_SseDecoder``). None is left.
}


def _blocks(code: str) -> list[tuple[str, int]]:
    """``(name, complexity)`` of every function and method in ``code`` (class totals excluded)."""
    found: list[tuple[str, int]] = []
    for block in cc_visit(code):
        if isinstance(block, Class):
            found += [(method.fullname, method.complexity) for method in block.methods]
        else:
            found.append((block.fullname, block.complexity))
    return sorted(set(found))  # radon lists a method both alone and under its class


@pytest.mark.parametrize("module", MODULES)
def test_every_function_is_under_the_complexity_limit(module: str) -> None:
    too_complex = {name: cc for name, cc in _blocks((LLM / module).read_text()) if cc >= LIMIT}
    assert too_complex == NOT_YET_SPLIT.get(module, {})


def test_the_guard_sees_a_complex_function() -> None:
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(LIMIT))
    assert max(cc for _, cc in _blocks(f"def f(x):\n{branches}\n    return -1\n")) == LIMIT + 1
