"""The ``knowledge`` capability kind: an agent searches the tenant's knowledge bases.

Binding ``config``::

    {"knowledge_bases": [ids], "top_k": 5, "search_first": false,
     "retrieve_before_first_turn": false, "focus": false, "search_tool": true, "user_uploads": false,
     "rewrite": false, "rerank": false}

- ``knowledge_bases``: tenant-wide knowledge bases of the agent's tenant (another tenant's,
  or a user's own, is "not found"); may be empty only with ``user_uploads``.
- ``top_k``: passages per search, 1–20 (a call may ask for another number in that range).
- ``search_first``: the run's first model turn must call ``knowledge_search`` (its tool
  choice is the tool: a native route gets ``tool_choice``, a text-mode route such as the
  embedded model a JSON-schema constrained reply, see
  :func:`llm.providers.openai_compat.build_request`); the model writes the query, the
  passages come back as the tool's result, and from the next turn on the choice is
  ``auto`` again (:func:`sessions.runner.turn.turn_tool_choice`), so it cannot loop, and a
  run resumed after that turn does not search again. For models that call tools
  unreliably.
- ``retrieve_before_first_turn``: instead, the run's user message itself is searched when the
  run starts and the passages go into the model input as a
  :class:`~capabilities.registry.ContextBlock` (the "RAG intent" mode; no model turn is spent
  on the search); ``knowledge_search`` is offered as well. Not together with
  ``search_first``.
- ``focus``: with ``retrieve_before_first_turn``, each passage the model is given before its
  first turn is cut to its lines that share the most words with the user's message
  (:mod:`knowledge.focus`; the run's citations keep the whole passages): a shorter prompt with
  fewer neighbouring values (measured there: worse on the embedded 0.5B model). Off by
  default.
- ``search_tool``: whether ``knowledge_search`` is offered (default true). ``false`` only with
  ``retrieve_before_first_turn``: the model answers from the passages it was given, and its
  prompt does not carry the tool's description and schema (~300 tokens in a text-mode route's
  prompt, read on every call).
- ``user_uploads``: the run's user's own knowledge bases (their chat uploads) are searched
  too.
- ``rewrite``: ask the run's model for a rewritten query, a third list
  (:func:`knowledge.retrieval.search`); off by default.
- ``rerank``: the rerank step over the best :data:`knowledge.tools.RERANK_CANDIDATES` fused
  hits; off (``false``) by default. ``true``: the run's model judges each passage
  (:mod:`knowledge.rerank`'s pointwise prompt, LLM calls of purpose ``rerank``).
  ``{"provider": id, "model": "name"}``: a **rerank model** (a cross-encoder) at one of the
  tenant's OpenAI-compatible model providers, through its ``/v1/rerank`` endpoint
  (:func:`llm.embeddings.arerank`): one request per search, better and cheaper than a small
  chat model's judgement. A failed rerank keeps the fused order (logged).

Passages are outside data whichever knowledge base they come from (a tenant-wide one holds
fetched URLs and uploaded files too): ``knowledge_search`` is ``untrusted`` (the runner frames
its results) and the block retrieved before the first turn is ``untrusted`` too (framed the
same way in the system message, :func:`sessions.runner.run_context.context_system_text`).

When a run completes with an answer that cites none of the passages it was given,
:meth:`KnowledgeKind.run_completed` attributes the answer's sentences to them
(:mod:`knowledge.attribution`).

One binding per agent (the first; ``spec_key``). Registered by ``knowledge.apps``'s
``ready()``. Tools and formatting: :mod:`knowledge.tools`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from capabilities.registry import CapabilityKind, ContextBlock, OpenContext, RunAnswer, kind_register
from capabilities.toolsets import KindToolset, ToolOrigin, ToolSource
from knowledge.tools import (
    MAX_TOP_K,
    CitationNumbers,
    KnowledgeSearchTool,
    RerankModel,
    Retrieval,
    SearchScope,
    context_passages,
    run_model,
)

CONFIG_DEFAULTS: dict[str, Any] = {
    "knowledge_bases": [], "top_k": 5, "search_first": False, "retrieve_before_first_turn": False,
    "focus": False, "search_tool": True, "user_uploads": False, "rewrite": False, "rerank": False,
}
"""Every key a ``knowledge`` binding's config may have, with its default."""
TOOL_NAME = "knowledge_search"


@dataclass(frozen=True, slots=True)
class KnowledgeBindingSpec:
    """A ``knowledge`` binding, as a run needs it."""

    kind: ClassVar[str] = "knowledge"
    knowledge_base_ids: tuple[int, ...]
    """The bound tenant-wide knowledge bases that still exist."""
    names: tuple[str, ...]
    """Their names (the tool's description and the context block's title)."""
    descriptions: tuple[str, ...]
    top_k: int = 5
    search_first: bool = False
    retrieve_before_first_turn: bool = False
    focus: bool = False
    """Passages before the first turn cut to their lines about the message (``"focus": true``)."""
    search_tool: bool = True
    """``knowledge_search`` is offered (``"search_tool": false``: not)."""
    user_uploads: bool = False
    rewrite: bool = False
    rerank: bool = False
    """The run's model judges the passages (``"rerank": true``)."""
    rerank_provider_id: int | None = None
    """A rerank model's provider (``"rerank": {"provider": …, "model": …}``), or None."""
    rerank_model: str = ""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


def config_errors(config: Any, *, tenant_id: int | None) -> list[str]:
    """What is wrong with a ``knowledge`` binding's ``config`` ([] if fine).

    ``tenant_id``: the binding's tenant; the knowledge bases must be its tenant-wide ones
    (checked in the database: another tenant's id reads "not found", like a missing one).
    """
    if not isinstance(config, dict):
        return []  # CapabilityBinding.clean reports a non-object itself
    errors = []
    unknown = set(config) - set(CONFIG_DEFAULTS)
    if unknown:
        errors.append(f"Unknown keys {sorted(unknown)}; a knowledge binding takes {sorted(CONFIG_DEFAULTS)}.")
    merged = {**CONFIG_DEFAULTS, **config}
    ids = merged["knowledge_bases"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        errors.append("knowledge_bases must be a list of knowledge base ids.")
        ids = []
    top_k = merged["top_k"]
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
        errors.append(f"top_k must be an integer from 1 to {MAX_TOP_K}.")
    for key in ("search_first", "retrieve_before_first_turn", "focus", "search_tool", "user_uploads", "rewrite"):
        if not isinstance(merged[key], bool):
            errors.append(f"{key} must be true or false.")
    errors += rerank_errors(merged["rerank"], tenant_id=tenant_id)
    errors += _mode_errors(merged)
    if not ids and merged["user_uploads"] is not True:
        errors.append("Name at least one knowledge base (or allow user uploads).")
    if ids and tenant_id is not None:
        errors += _missing_bases_errors(ids, tenant_id=tenant_id)
    return errors


def _mode_errors(merged: dict[str, Any]) -> list[str]:
    """The retrieval modes that do not go together."""
    errors = []
    if merged["search_first"] is True and merged["retrieve_before_first_turn"] is True:
        errors.append("Choose one of search_first (the model's first turn calls knowledge_search) and "
                      "retrieve_before_first_turn (the user's message is searched before it).")
    if merged["search_tool"] is False and merged["retrieve_before_first_turn"] is not True:
        errors.append("search_tool can be false only with retrieve_before_first_turn (else the agent gets no "
                      "passages at all).")
    return errors


def _missing_bases_errors(ids: list[int], *, tenant_id: int) -> list[str]:
    """The ids that are not tenant-wide knowledge bases of ``tenant_id`` (another tenant's read
    "not found", like a missing one)."""
    from knowledge.models import KnowledgeBase

    # tenant-bypass: the binding's own tenant is named explicitly (the admin may act for several).
    found = set(KnowledgeBase.all_tenants.filter(tenant_id=tenant_id, owner__isnull=True, pk__in=ids)
                .values_list("pk", flat=True))
    missing = [i for i in ids if i not in found]
    return [f"Knowledge base{'s' if len(missing) > 1 else ''} {missing} not found."] if missing else []


RERANK_MODEL_MAX_CHARS = 200
"""Longest rerank model name (as a route entry's model name)."""


def rerank_errors(value: Any, *, tenant_id: int | None) -> list[str]:
    """What is wrong with a binding's ``rerank`` value ([] if fine): ``true``, ``false`` or
    ``{"provider": id, "model": "name"}`` naming an OpenAI-compatible model provider of the
    binding's tenant (another tenant's id reads "not found", like a missing one)."""
    if isinstance(value, bool):
        return []
    shape = ("rerank must be true (the run's model judges the passages), false, or "
             '{"provider": <model provider id>, "model": "<rerank model name>"}.')
    if not isinstance(value, dict) or set(value) != {"provider", "model"}:
        return [shape]
    provider_id, model = value["provider"], value["model"]
    if isinstance(provider_id, bool) or not isinstance(provider_id, int):
        return [shape]
    if not isinstance(model, str) or not model.strip() or len(model) > RERANK_MODEL_MAX_CHARS:
        return [f"rerank.model must be the provider's rerank model name (1–{RERANK_MODEL_MAX_CHARS} characters)."]
    if tenant_id is None:
        return []
    from llm.models import ModelProvider, ProviderApi

    # tenant-bypass: the binding's own tenant is named explicitly (the admin may act for several).
    api = ModelProvider.all_tenants.filter(tenant_id=tenant_id, pk=provider_id).values_list("api", flat=True).first()
    if api is None:
        return [f"Model provider {provider_id} (rerank.provider) not found."]
    if api != ProviderApi.OPENAI:
        return [f"Model provider {provider_id} (rerank.provider) speaks the {api} API, which has no rerank "
                "endpoint; choose an OpenAI-compatible provider."]
    return []


class KnowledgeKind(CapabilityKind):
    """Bindings of kind ``knowledge``: ``knowledge_search`` and, optionally, passages before the first turn."""

    key = "knowledge"
    label = "Knowledge bases"
    fields = ("approval_policy", "config")
    position = 50

    def validate(self, binding: Any) -> dict[str, Any]:
        errors = config_errors(binding.config, tenant_id=binding.tenant_id)
        return {"config": errors} if errors else {}

    def spec_key(self, binding: Any) -> str:
        return "knowledge"  # one knowledge binding per agent: the first

    def load_spec(self, binding: Any) -> KnowledgeBindingSpec | None:
        """The binding's spec, with the bound knowledge bases that still exist (in the run's
        tenant); None when none is left and user uploads are off."""
        from knowledge.models import KnowledgeBase

        config = {**CONFIG_DEFAULTS, **(binding.config if isinstance(binding.config, dict) else {})}
        ids = [i for i in config["knowledge_bases"] if isinstance(i, int)]
        rows = {kb.pk: kb for kb in KnowledgeBase.objects.filter(pk__in=ids, owner__isnull=True)}
        kbs = [rows[i] for i in ids if i in rows]
        if not kbs and not config["user_uploads"]:
            return None
        top_k = config["top_k"] if isinstance(config["top_k"], int) and 1 <= config["top_k"] <= MAX_TOP_K else 5
        rerank = config["rerank"]
        rerank_model = rerank if isinstance(rerank, dict) and not rerank_errors(rerank, tenant_id=None) else None
        return KnowledgeBindingSpec(
            knowledge_base_ids=tuple(kb.pk for kb in kbs), names=tuple(kb.name for kb in kbs),
            descriptions=tuple(kb.description for kb in kbs), top_k=top_k,
            search_first=config["search_first"] is True and config["retrieve_before_first_turn"] is not True,
            retrieve_before_first_turn=config["retrieve_before_first_turn"] is True,
            focus=config["focus"] is True, search_tool=config["search_tool"] is not False,
            user_uploads=config["user_uploads"] is True, rewrite=config["rewrite"] is True,
            rerank=rerank is True, rerank_provider_id=rerank_model["provider"] if rerank_model else None,
            rerank_model=rerank_model["model"].strip() if rerank_model else "",
            binding_id=binding.pk, approval_policy=tuple(binding.approval_policy),
        )

    async def open_toolset(self, specs: Sequence[KnowledgeBindingSpec], ctx: OpenContext) -> list[tuple[Any, KindToolset]]:
        opened = []
        for spec in specs:
            if not spec.search_tool and not spec.search_first:
                continue
            retrieval = run_retrieval(spec, ctx)
            description = tool_description(spec)
            opened.append((spec, KindToolset(sources=[ToolSource(
                origin=ToolOrigin(source="knowledge", name=TOOL_NAME),
                factory=lambda exposed, s=spec, r=retrieval, d=description: KnowledgeSearchTool(
                    exposed=exposed, retrieval=r, default_top_k=s.top_k, numbers=lambda: run_numbers(ctx),
                    description=d, call_first=s.search_first),
            )])))
        return opened

    async def run_context(self, specs: Sequence[KnowledgeBindingSpec], ctx: OpenContext, query: str) -> list[ContextBlock]:
        """The passages for the user's message, for bindings with ``retrieve_before_first_turn``."""
        blocks: list[ContextBlock] = []
        for spec in specs:
            if spec.retrieve_before_first_turn:
                blocks += await context_passages(retrieval=run_retrieval(spec, ctx), query=query, top_k=spec.top_k,
                                                 numbers=run_numbers(ctx), names=spec.names, focus=spec.focus)
        return blocks

    async def run_completed(self, specs: Sequence[KnowledgeBindingSpec], ctx: OpenContext,
                            answer: RunAnswer) -> list[dict[str, Any]] | None:
        """The answer's sentences attributed to the passages the run was given (its start
        context's and its ``knowledge_search`` results' citations) when it cites none of them
        (:func:`knowledge.attribution.attribute`); None when it cites one, or had no passage."""
        from knowledge.attribution import attribute

        citations: list[Any] = []
        for block in answer.context:
            if block.source == self.key and isinstance(block.data, dict):
                citations += block.data.get("citations") or []
        for result in answer.tool_results:
            if result.source == self.key and result.name == TOOL_NAME and isinstance(result.data, dict):
                citations += result.data.get("citations") or []
        if not citations or ctx.in_thread is None:
            return None
        return await attribute(answer.reply, citations, in_thread=ctx.in_thread)


def run_scope(spec: KnowledgeBindingSpec, ctx: OpenContext) -> SearchScope:
    """What the run ``ctx`` may search through ``spec``."""
    return SearchScope(tenant_id=ctx.tenant_id, knowledge_base_ids=spec.knowledge_base_ids,
                       user_id=ctx.user_id if spec.user_uploads else None)


def run_retrieval(spec: KnowledgeBindingSpec, ctx: OpenContext) -> Retrieval:
    """How the run ``ctx`` retrieves through ``spec``: its scope, its DB thread, the run's
    route for the optional rewrite and rerank (one metered caller per purpose per run: LLM
    calls of purpose ``query_rewrite`` / ``rerank`` for the run's agent and user), and the
    binding's rerank model, if it names one."""
    return Retrieval(scope=run_scope(spec, ctx), in_thread=ctx.in_thread,
                     rewrite=_run_model(ctx, "query_rewrite") if spec.rewrite else None,
                     rerank=_run_model(ctx, "rerank") if spec.rerank else None,
                     rerank_model=(RerankModel(provider_id=spec.rerank_provider_id, model=spec.rerank_model)
                                   if spec.rerank_provider_id is not None else None))


def _run_model(ctx: OpenContext, purpose: str) -> Any:
    """The run's :func:`run_model` for ``purpose`` (kept in ``ctx.extra``)."""
    from llm.metering import CallSite

    key = f"knowledge.model.{purpose}"
    if key not in ctx.extra:
        site = CallSite(tenant_id=ctx.tenant_id, purpose=purpose, entry_ids=tuple(getattr(ctx.run, "entry_ids", ())),
                        agent_id=ctx.agent_id, user_id=ctx.user_id)
        ctx.extra[key] = run_model(getattr(ctx.run, "entries", ()), site=site, in_thread=ctx.in_thread)
    return ctx.extra[key]


def run_numbers(ctx: OpenContext) -> CitationNumbers:
    """The run's :class:`CitationNumbers` (one per run, in ``ctx.extra``), seeded from the
    stored start context of a resumed run (``ctx.extra["run_context"]``)."""
    numbers = ctx.extra.get("knowledge.citations")
    if numbers is None:
        numbers = ctx.extra["knowledge.citations"] = CitationNumbers()
    stored = ctx.extra.get("run_context")
    if stored is not None and not numbers.seeded:
        numbers.seeded = True
        for block in stored:
            if block.source == "knowledge" and isinstance(block.data, dict):
                numbers.seed(block.data.get("citations") or [])
    return numbers


def tool_description(spec: KnowledgeBindingSpec) -> str:
    """The model's description of ``knowledge_search`` for ``spec``: what it searches."""
    holdings = "; ".join(f"“{n}”" + (f": {d.strip()}" if d.strip() else "")
                         for n, d in zip(spec.names, spec.descriptions, strict=True))
    if spec.user_uploads:
        holdings = f"{holdings}; and the user's own uploaded documents" if holdings else "the user's own uploaded documents"
    return (f"Search the knowledge bases ({holdings}) for passages relevant to a query. Returns numbered "
            "passages; cite the ones you use as [n]. Use it for questions these documents can answer.")


kind_register(KnowledgeKind())
