"""Complexity guard (issues 24 and 35): no function or method of the product reaches radon
cyclomatic complexity :data:`LIMIT` (15; radon grade C starts at 11), outside the explicit
list :data:`NOT_YET_SPLIT`, which only shrinks.

The product is every module of the project's packages (:data:`PACKAGES`, import-linter's
``root_packages``) except tests and migrations; ``scripts/`` and ``bench/`` are tools, not
product. Nested functions (closures) and the methods of nested classes are measured on their
own (radon does not add a closure to the function around it).

:data:`NOT_YET_SPLIT` names each function at or over the limit (``"path.py:Class.method"``)
with the complexity it had when listed. The test fails when:

- a function not on the list reaches the limit (split it);
- a listed function's complexity changed: rose (split it back) or fell while still at or over
  the limit (write the lower figure, so it cannot creep back);
- a listed function fell under the limit or is gone (remove it from the list).

To print the list the tree has now (e.g. after a colleague's split)::

    .venv/bin/python agent_platform/tests/test_complexity.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 15
"""A function reaching this cyclomatic complexity fails the guard (``llm`` ``Router.stream``
was 27 before it was split into steps)."""
PACKAGES = ("agent_platform", "tenants", "llm", "documents", "capabilities", "agents", "browser", "sessions",
            "console", "frontend", "knowledge", "memory", "evaluation", "automations")
"""The project's top-level packages (import-linter's ``root_packages``)."""

NOT_YET_SPLIT: dict[str, int] = {
    "agent_platform/local_secrets.py:database_logins": 16,
    "agent_platform/redis_clients.py:redis_stream_open": 16,
    "browser/server_backend.py:ServerBrowserPool._execute": 22,
    "browser/tools.py:BrowserWaitFor.params": 15,
    "capabilities/admin.py:SkillForm.clean": 15,
    "capabilities/builtin/web.py:WebFetchTool.execute": 16,
    "capabilities/builtin/web.py:WebReadTool.execute": 15,
    "capabilities/builtin/web.py:html_to_markdown": 19,
    "capabilities/catalogue.py:ProgramTemplate.clean": 42,
    "capabilities/catalogue.py:parameters_errors": 15,
    "capabilities/cli/template.py:template_errors": 19,
    "capabilities/naming.py:assign_exposed_names": 16,
    "capabilities/skills/parsing.py:skill_parse": 34,
    "documents/markdown.py:find_section": 16,
    "knowledge/api/views.py:DocumentListApi.post": 20,
    "knowledge/kind.py:KnowledgeKind.load_spec": 19,
    "knowledge/kind.py:config_errors": 16,
    "knowledge/mcp_server.py:knowledge_search_call": 23,
    "knowledge/parsing.py:parse_docx": 22,
    "knowledge/retrieval.py:search": 27,
    "knowledge/tools.py:search_arguments": 16,
    "llm/embeddings.py:_rerank_scores": 15,
    "llm/embeddings.py:_vectors": 23,
    "llm/errors.py:_classify_body_only": 21,
    "llm/errors.py:_facts": 26,
    "llm/errors.py:classify_error": 16,
    "llm/errors.py:classify_http_error": 29,
    "llm/netrules.py:address_block_reason": 16,
    "llm/netrules.py:check_outbound_url": 15,
    "llm/testing.py:FakeLLMServer._dispatch": 15,
    "llm/testing.py:FakeLLMServer._perform": 15,
    "llm/testing_anthropic.py:FakeAnthropicServer._perform": 21,
    "llm/toolcall_parsing.py:ToolCallHoldback._step_json": 17,
    "llm/toolcall_parsing.py:ToolCallHoldback._step_pass": 24,
    "tenants/audit.py:audit_record": 18,
}
"""Functions at or over :data:`LIMIT` today, each with its complexity: none may be added, a
listed one may only be split (and then removed). Split so far, among others: llm's
``Router.stream`` (27), openai_compat ``_stream`` (36), anthropic ``stream_chat`` (25),
``_sse_payloads`` (27), console's ``run_trace`` (52; now :mod:`sessions.trace_selectors`)."""


def product_modules() -> list[Path]:
    """Every product module (tests and migrations left out), sorted."""
    return sorted(
        path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
        if not {"tests", "migrations"} & set(path.relative_to(ROOT).parts)
    )


def _functions(blocks: list[Function | Class], prefix: str = "") -> Iterator[tuple[str, int]]:
    """``(qualified name, complexity)`` of every function, method, closure and nested class's
    method in ``blocks`` (radon's results for one module, or the parts of one block)."""
    for block in blocks:
        if isinstance(block, Class):
            yield from _functions([*block.methods, *block.inner_classes], f"{prefix}{block.name}.")
        else:
            yield f"{prefix}{block.name}", block.complexity
            yield from _functions(block.closures, f"{prefix}{block.name}.")


def complexities(code: str) -> dict[str, int]:
    """Qualified name → cyclomatic complexity of every function in ``code`` (the highest, when
    one name is defined twice)."""
    found: dict[str, int] = {}
    for name, complexity in _functions([b for b in cc_visit(code) if isinstance(b, Class) or not b.is_method]):
        found[name] = max(complexity, found.get(name, 0))
    return found


def over_the_limit() -> dict[str, int]:
    """``"path.py:qualified.name"`` → complexity of every product function at or over :data:`LIMIT`."""
    return {
        f"{path.relative_to(ROOT)}:{name}": complexity
        for path in product_modules() for name, complexity in complexities(path.read_text()).items()
        if complexity >= LIMIT
    }


def problems(found: dict[str, int], listed: dict[str, int]) -> list[str]:
    """What is wrong between the functions ``found`` over the limit and the ``listed`` ones."""
    out = [f"{key}: complexity {cc} reaches {LIMIT}: split it (the list of exceptions only shrinks)"
           for key, cc in found.items() if key not in listed]
    for key, figure in listed.items():
        cc = found.get(key)
        if cc is None:
            out.append(f"{key}: now under {LIMIT} (or gone): remove it from NOT_YET_SPLIT")
        elif cc > figure:
            out.append(f"{key}: complexity rose from {figure} to {cc}: split it")
        elif cc < figure:
            out.append(f"{key}: complexity fell from {figure} to {cc}: write {cc} in NOT_YET_SPLIT")
    return sorted(out)


def test_no_function_reaches_the_limit_outside_the_shrinking_list() -> None:
    assert problems(over_the_limit(), NOT_YET_SPLIT) == []


def test_the_guard_sees_a_complex_function_method_closure_and_nested_class() -> None:
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(LIMIT))
    function = f"def f(x):\n{branches}\n    return -1\n"
    assert complexities(function) == {"f": LIMIT + 1}
    indented = function.replace("\n", "\n    ").rstrip()
    assert complexities(f"class A:\n    {indented.replace('def f(x)', 'def f(self, x)')}\n")["A.f"] == LIMIT + 1
    assert complexities(f"def outer():\n    {indented}\n    return f\n") == {"outer": 1, "outer.f": LIMIT + 1}
    nested = f"class A:\n    class B:\n        {indented.replace(chr(10), chr(10) + '    ')}\n"
    assert complexities(nested)["A.B.f"] == LIMIT + 1


def test_the_list_only_shrinks() -> None:
    listed = {"a.py:f": 20, "a.py:g": 30, "b.py:h": 16, "c.py:gone": 17}
    found = {"a.py:f": 20, "a.py:g": 31, "b.py:h": 15, "d.py:new": 15}
    assert problems(found, listed) == [
        "a.py:g: complexity rose from 30 to 31: split it",
        "b.py:h: complexity fell from 16 to 15: write 15 in NOT_YET_SPLIT",
        f"c.py:gone: now under {LIMIT} (or gone): remove it from NOT_YET_SPLIT",
        f"d.py:new: complexity 15 reaches {LIMIT}: split it (the list of exceptions only shrinks)",
    ]


if __name__ == "__main__":
    print("NOT_YET_SPLIT: dict[str, int] = {")
    for key, cc in sorted(over_the_limit().items()):
        print(f'    "{key}": {cc},')
    print("}")
