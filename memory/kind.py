"""The ``memory`` capability kind: long-term memory per user and agent.

A binding of kind ``memory`` turns memory on for its agent (config: :mod:`memory.policy`).
It offers no tools. At a run's start (:meth:`MemoryKind.run_context`) it recalls the
``max_items`` memories of the run's user and agent most similar to the run's user message
and gives them to the model as one block ("What you know about this user ..."). Extraction
runs outside runs (:mod:`memory.tasks`). Registered by ``memory.apps.MemoryConfig.ready``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.registry import CapabilityKind, ContextBlock, OpenContext, kind_register
from capabilities.toolsets import KindToolset
from memory.policy import KEY, MemoryPolicy, policy_errors

logger = logging.getLogger(__name__)

BLOCK_TITLE = "What you know about this user"


@dataclass(frozen=True, slots=True)
class MemoryBindingSpec:
    """An agent's ``memory`` binding, loaded for a run."""

    kind: ClassVar[str] = KEY
    agent_id: int
    policy: MemoryPolicy
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


class MemoryKind(CapabilityKind):
    """Bindings of kind ``memory`` (one per agent: the first enabled binding counts)."""

    key = KEY
    label = "Memory"
    fields = ("config",)
    position = 70

    def validate(self, binding: Any) -> dict[str, Any]:
        if not isinstance(binding.config, dict):  # reported by CapabilityBinding.clean
            return {}
        errors = policy_errors(binding.config)
        return {"config": [f"{key}: {msg}" if key != "config" else msg for key, msg in errors.items()]} if errors else {}

    def spec_key(self, binding: Any) -> str:
        return KEY

    def load_spec(self, binding: Any) -> MemoryBindingSpec:
        return MemoryBindingSpec(agent_id=binding.agent_id, policy=MemoryPolicy.from_config(binding.config),
                                 binding_id=binding.pk)

    async def open_toolset(self, specs: Sequence[MemoryBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        return []  # memory offers no tools: it works through run_context and extraction

    async def run_context(self, specs: Sequence[MemoryBindingSpec], ctx: OpenContext, query: str) -> list[ContextBlock]:
        """One block with the ``max_items`` memories of the run's user and agent most similar
        to ``query`` (the run's user message), or none (no user, no memories, empty query, an
        evaluation experiment's run).

        The query is embedded with the tenant's default embedding provider (in a thread; it is
        a blocking HTTP call); the search and the ``last_used_at`` touch run on the run's
        database thread (``ctx.in_thread``) under its tenant scope. Only memories of
        ``ctx.user_id`` and the binding's agent are searched.

        Raises:
            EmbeddingError: the embedding provider failed (the runner logs it; the run goes on).
        """
        if not specs or not query.strip():
            return []
        if getattr(ctx.run, "purpose", None) == "evaluation":
            # An experiment measures the agent's configuration: the results must not depend on
            # the memories of whoever started it (nor feed them: memory.selectors).
            return []
        user_id = ctx.user_id if ctx.user_id is not None else getattr(ctx.run, "user_id", None)
        if user_id is None:
            return []
        spec = specs[0]
        from memory import services  # Django models: imported when a run uses memory

        in_thread = ctx.in_thread or _to_thread
        recalled = await services.memory_recall_async(
            tenant_id=ctx.tenant_id, user_id=user_id, agent_id=spec.agent_id, query=query,
            limit=spec.policy.max_items, in_thread=in_thread,
        )
        if not recalled:
            return []
        from memory.extraction import recall_text

        return [ContextBlock(source=KEY, title=BLOCK_TITLE, text=recall_text([m.text for m in recalled]),
                             data={"memory_ids": [m.pk for m in recalled]}, untrusted=True)]


def _to_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``in_thread`` when the caller gave none: the function on a worker thread (the tenant
    scope copied with the context), the thread's database connection closed afterwards."""
    def closing(**kwargs: Any) -> Any:
        from django.db import connection

        try:
            return fn(**kwargs)
        finally:
            connection.close()

    async def call(**kwargs: Any) -> Any:
        return await asyncio.to_thread(closing, **kwargs)

    return call


kind_register(MemoryKind())
