"""axe-core accessibility checks for Playwright pages (shared by the chat app's and the
console's browser tests).

axe-core is vendored, test-only, at ``frontend/tests/vendor/axe.min.js`` (version and sha256 in
``frontend/tests/vendor/README.md``; ``scripts/vendor_frontend.sh`` reproduces it from npm).

Usage::

    from frontend.tests.axe import assert_no_serious_axe_violations

    assert_no_serious_axe_violations(page)                       # the whole page
    assert_no_serious_axe_violations(page, include="#main")      # one region
    assert_no_serious_axe_violations(page, exclude=[".vendor-widget"])

The script is injected with ``page.evaluate`` (a DevTools evaluation), not a ``<script>`` tag:
the app's Content-Security-Policy (``script-src 'self'``) would block an inline script tag, and
the page under test must not need a weaker policy to be tested.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

AXE_PATH = Path(__file__).resolve().parent / "vendor" / "axe.min.js"

#: Impacts that fail a test (axe's scale: minor < moderate < serious < critical).
FAILING_IMPACTS = frozenset({"serious", "critical"})


def inject_axe(page: Any) -> None:
    """Make ``window.axe`` available in ``page`` (a Playwright sync ``Page``); idempotent.

    Raises:
        AssertionError: axe-core did not load (``window.axe`` missing afterwards).
    """
    if page.evaluate("() => typeof window.axe !== 'undefined'"):
        return
    page.evaluate(AXE_PATH.read_text(encoding="utf-8"))
    assert page.evaluate("() => typeof window.axe !== 'undefined'"), "axe-core did not load"


def axe_violations(
    page: Any,
    *,
    include: str | None = None,
    exclude: Iterable[str] = (),
    tags: Iterable[str] = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"),
) -> list[dict]:
    """Run axe-core on ``page`` and return its violations.

    Args:
        page: a Playwright sync ``Page`` with the screen to check already rendered.
        include: a CSS selector to limit the check to; ``None`` checks the whole document.
        exclude: CSS selectors to leave out.
        tags: axe rule tags to run (default: WCAG 2.1 A/AA plus axe's best practices).

    Returns:
        axe's ``violations`` list: dicts with ``id``, ``impact`` ("minor" | "moderate" |
        "serious" | "critical"), ``help``, ``helpUrl`` and ``nodes`` (each with ``target``
        and ``failureSummary``).
    """
    inject_axe(page)
    context: dict[str, Any] = {}
    if include:
        context["include"] = [[include]]
    excluded = [[s] for s in exclude]
    if excluded:
        context["exclude"] = excluded
    return page.evaluate(
        """async ([context, tags]) => {
            const target = Object.keys(context).length ? context : document;
            const result = await window.axe.run(target, {
                runOnly: { type: 'tag', values: tags },
                resultTypes: ['violations'],
            });
            return result.violations.map((v) => ({
                id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
                nodes: v.nodes.map((n) => ({ target: n.target, html: n.html, failureSummary: n.failureSummary })),
            }));
        }""",
        [context, list(tags)],
    )


def format_violations(violations: list[dict]) -> str:
    """A readable multi-line report of ``violations`` (as returned by :func:`axe_violations`)."""
    lines = []
    for v in violations:
        lines.append(f"[{v['impact']}] {v['id']}: {v['help']} ({v['helpUrl']})")
        for node in v["nodes"][:5]:
            lines.append(f"    {node['target']}: {node['html'][:160]}")
            summary = (node.get("failureSummary") or "").replace("\n", " | ")
            if summary:
                lines.append(f"      {summary[:300]}")
        if len(v["nodes"]) > 5:
            lines.append(f"    ... and {len(v['nodes']) - 5} more")
    return "\n".join(lines)


def assert_no_serious_axe_violations(
    page: Any, *, include: str | None = None, exclude: Iterable[str] = (), label: str = ""
) -> list[dict]:
    """Fail if axe-core finds a ``serious`` or ``critical`` violation on ``page``.

    Args:
        page: a Playwright sync ``Page``.
        include / exclude: as in :func:`axe_violations`.
        label: a name for the screen, shown in the failure message.

    Returns:
        The remaining (minor/moderate) violations, for a test that wants to look at them.

    Raises:
        AssertionError: listing every serious/critical violation with the offending nodes.
    """
    violations = axe_violations(page, include=include, exclude=exclude)
    failing = [v for v in violations if v.get("impact") in FAILING_IMPACTS]
    assert not failing, f"axe-core: serious/critical violations{' on ' + label if label else ''}:\n" + (
        format_violations(failing)
    )
    return [v for v in violations if v.get("impact") not in FAILING_IMPACTS]
