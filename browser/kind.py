"""The ``browser`` capability kind: the browser tools (:mod:`browser.tools`) of an agent.

Validation: ``config`` is a browser config (:func:`browser.origins.origin_config_errors`).
Spec: :class:`BrowserBindingSpec` (one browser per agent: its first binding). Toolset: the
browser tools, source ``browser``, bare names, sharing one :class:`browser.tools.BrowserRun`
(backend choice, origin rules). Registered by ``browser.apps.BrowserConfig.ready``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from browser.origins import origin_config_errors
from capabilities.builtin.kind import renamed
from capabilities.registry import CapabilityKind, OpenContext, kind_register
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource


@dataclass(frozen=True, slots=True)
class BrowserBindingSpec:
    """A ``browser`` binding: the browser tools, on the extension or the server backend."""

    kind: ClassVar[str] = "browser"
    config: dict = field(default_factory=dict)
    """``{backend, fallback_to_server, allowed_origins, blocked_origins}`` (browser.tools.BrowserConfig)."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


class BrowserKind(CapabilityKind):
    """Bindings of kind ``browser``."""

    key = "browser"
    label = "Browser"
    fields = ("allowed_tools", "approval_policy", "config")
    position = 40

    def validate(self, binding: Any) -> dict[str, Any]:
        if not isinstance(binding.config, dict):  # reported by CapabilityBinding.clean
            return {}
        errors = origin_config_errors(binding.config)
        return {"config": errors} if errors else {}

    def spec_key(self, binding: Any) -> str:
        return "browser"  # one browser per agent: the first binding

    def load_spec(self, binding: Any) -> BrowserBindingSpec:
        return BrowserBindingSpec(config=dict(binding.config), binding_id=binding.pk,
                                  approval_policy=tuple(binding.approval_policy))

    async def open_toolset(self, specs: Sequence[BrowserBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        from browser.tools import BrowserConfig, BrowserRun, browser_tools

        opened = []
        for b in specs:
            run = BrowserRun(config=BrowserConfig.from_json(b.config))
            opened.append((b, KindToolset(sources=[
                ToolSource(origin=ToolOrigin(source="browser", name=tool.spec.name),
                           factory=lambda exposed, t=tool: renamed(t, exposed))
                for tool in browser_tools(run)
            ])))
        return opened


kind_register(BrowserKind())
