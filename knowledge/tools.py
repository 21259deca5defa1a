"""``knowledge_search``: the tool the ``knowledge`` capability kind offers, and the passage
formatting it shares with retrieval before the first turn.

The model reads numbered passages (``[n] document › heading`` then the text), framed as
outside data; the request to cite them as ``[n]`` is the platform's own text, outside the
frame: in the tool's description and in the title of the block retrieved before the first
turn (the agent's system prompt may ask too, as the demo's does); clients read the same passages as citations in the tool
call's ``data`` (``{"citations": [{n, knowledge_base_id, document_id, document_title, chunk_id,
position, heading, score, snippet}]}``), which the chat app shows under the answer.

Numbers are per run (:class:`CitationNumbers`): the passages retrieved before the first turn
are [1]…[k], a later search goes on from k + 1, and a chunk found again keeps its number, so
every ``[n]`` of an answer names one passage.

Searches run :func:`knowledge.retrieval.search` on the run's database thread (the runner's
``in_thread`` port), under the run's tenant scope; a user's own knowledge bases are searched
only when the binding allows user uploads, and only the run's user's.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from capabilities.registry import ContextBlock
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from knowledge.chunking import HEADING_SEPARATOR
from knowledge.focus import focus_passages
from knowledge.search_limits import rest_limits_refusal
from llm.types import ToolSpec

MAX_TOP_K = 20
"""The largest ``top_k`` a binding or a call may ask for."""
MAX_QUERY_CHARS = 1000
"""Longer queries are refused (a tool call) or cut (the user's message before the first turn)."""
SNIPPET_CHARS = 240
"""Characters of a passage kept as the citation's snippet."""
CITE_NOTE = "Cite the passages you use by their number in square brackets, e.g. [1], right after the sentence they support."
"""Not part of the passages (which are framed as outside data, so an instruction inside them
would be data too). bench/knowledge_citations.py measured the embedded 0.5B model with it
inside the result and after the results (the text-mode follow-up): it cited in neither, and
after the results it copied the passages out instead of answering, so it is not sent there.
Measured too (issue 26), none adopted: a few-shot example answer in the agent's prompt, the
passage's number at the start of its text line, "Source [n]" headers (0 of the first 5
questions cited, each), its number after each of its sentences (0 of 3); in the follow-up, an
example sentence (the answer was that sentence, 4 of 4) and, on 8 questions: "cite them as
[n]" (3 of 8 with an [n], 1 echoing the passages), "end each sentence with the number of the
result … like [1]" (2 of 8, 6 echoed), that with each passage sentence numbered too (6 of 8
with an [n], but 2 of them only markers and 2 more echoed passages), "then a Sources: line"
(all 8 were only that line, no answer). An uncited answer with the passages shown under it
is the better demo."""
QUERY_DESCRIPTION = "The user's question, word for word."
"""The ``query`` parameter's description (what the model reads about it).

Small models copy a parameter's description into a forced call. bench/knowledge_citations.py,
embedded 0.5B model: with the former "What to look for, in natural language or keywords." it
sent that sentence as its query in 3 of 14 questions (2 of the first 6, 1 of the 8 held-out);
with this one, in none of 16 (the first 8, the 8 held-out). But it then copied the tool's
description (the knowledge base's) instead in 1 of the first 8 and 2 of the 8 held-out (the
former: 1 of 14). A passage that answers was among the 4 found in 4 of the first 6 questions
(the former: 3) and in 6 of the 8 held-out ones (the former: 6 too): no gain measured there. A
capable model writes its own query either way."""
NO_PASSAGES = "No passages found for this query in the knowledge bases."
REWRITE_PROMPT = (
    "Rewrite the question below as a short search query for a documentation search: the key terms and "
    "likely synonyms, no explanation. Reply with the query only.\n\nQuestion: {query}"
)
REWRITE_MAX_OUTPUT_TOKENS = 48
RERANK_CANDIDATES = 20
"""How many fused hits the rerank step judges (the best ``top_k`` of them are kept)."""

logger = logging.getLogger(__name__)

Complete = Callable[[str, int], Awaitable[str]]
"""``await complete(prompt, max_output_tokens) -> text``: one model call on the run's route."""

InThread = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]


@dataclass(slots=True)
class CitationNumbers:
    """A run's citation numbers: ``{chunk_id: n}``, the next number after the highest given.

    One per run (kept in ``OpenContext.extra``), shared by the retrieval before the first
    turn and every ``knowledge_search`` call of the run.
    """

    by_chunk: dict[int, int] = field(default_factory=dict)
    next_n: int = 1
    seeded: bool = False
    """The run's stored start context has been read (:func:`knowledge.kind.run_numbers`)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def number(self, chunk_id: int) -> int:
        """The number of ``chunk_id`` in this run (a new one the first time)."""
        n = self.by_chunk.get(chunk_id)
        if n is None:
            n = self.by_chunk[chunk_id] = self.next_n
            self.next_n += 1
        return n

    def seed(self, citations: Sequence[dict[str, Any]]) -> None:
        """Take the numbers of ``citations`` already given in this run (a resumed run's stored
        start context)."""
        for c in citations:
            try:
                chunk_id, n = int(c["chunk_id"]), int(c["n"])
            except (KeyError, TypeError, ValueError):
                continue
            self.by_chunk.setdefault(chunk_id, n)
            self.next_n = max(self.next_n, n + 1)


def _snippet(text: str) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"


def _where(title: str, heading: str) -> str:
    """A passage's ``document › heading`` line, the document's title said once: a Markdown
    document's heading path starts with its level-1 heading, which is its title once parsed
    ("Settings reference › Settings reference > What each does" becomes "Settings reference ›
    What each does")."""
    if heading == title:
        return title
    if heading.startswith(title + HEADING_SEPARATOR):
        heading = heading[len(title) + len(HEADING_SEPARATOR):]
    return f"{title} › {heading}" if heading else title


def passages_render(hits: Sequence[Any], numbers: CitationNumbers,
                    texts: Sequence[str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Numbered passages for the model and their citations for clients.

    Args:
        hits: :class:`knowledge.retrieval.Hit` s, best first.
        numbers: The run's citation numbers (updated).
        texts: The model's text of each hit instead of the hit's own (a focused passage,
            :mod:`knowledge.focus`); the citations' snippets stay the hits' own. None: the hits'.

    Returns:
        ``(text, citations)``: ``text`` is ``[n] title › heading`` + the passage per hit
        (blank-line separated); ``citations`` the ``{n, knowledge_base_id, document_id,
        document_title, chunk_id, position, heading, score, snippet}`` of each hit (``score``:
        the fused retrieval score, higher is better).
    """
    parts, citations = [], []
    for i, hit in enumerate(hits):
        n = numbers.number(hit.chunk_id)
        where = _where(hit.document_title, hit.heading)
        parts.append(f"[{n}] {where}\n{(hit.text if texts is None else texts[i]).strip()}")
        citations.append({
            "n": n, "knowledge_base_id": hit.knowledge_base_id, "document_id": hit.document_id,
            "document_title": hit.document_title, "chunk_id": hit.chunk_id, "position": hit.position,
            "heading": hit.heading, "score": round(float(hit.score), 6), "snippet": _snippet(hit.text),
        })
    return "\n\n".join(parts), citations


@dataclass(frozen=True, slots=True)
class SearchScope:
    """What one run may search: its tenant, the bound knowledge bases, and (with user uploads)
    its user's own knowledge bases."""

    tenant_id: int
    knowledge_base_ids: tuple[int, ...]
    user_id: int | None
    """The run's user when the binding allows user uploads (their own knowledge bases are
    searched too), else None (only tenant-wide knowledge bases)."""


def search_sync(scope: SearchScope, *, query: str, top_k: int, document_ids: list[int] | None = None,
                tags: list[str] | None = None, rewritten: str = "") -> list[Any]:
    """:func:`knowledge.retrieval.search` over ``scope`` (synchronous: call it on the run's
    database thread, under its tenant scope). The user's own knowledge bases are added to the
    bound ones when ``scope.user_id`` is set.

    Returns:
        The hits, best first (at most ``top_k``).
    """
    from knowledge.models import KnowledgeBase
    from knowledge.retrieval import search

    kb_ids = list(scope.knowledge_base_ids)
    if scope.user_id is not None:
        kb_ids += [pk for pk in KnowledgeBase.objects.filter(owner_id=scope.user_id).values_list("pk", flat=True)
                   if pk not in kb_ids]
    if not kb_ids:
        return []
    return search(tenant_id=scope.tenant_id, knowledge_base_ids=kb_ids, query=query, user_id=scope.user_id,
                  top_k=top_k, document_ids=document_ids or None, tags=tags or None,
                  rewrite=(lambda _query: rewritten) if rewritten else None)


def run_model(entries: Sequence[Any], *, site: Any = None, in_thread: InThread | None = None) -> Complete | None:
    """A ``complete(prompt, max_output_tokens)`` over the run's route entries (retries and
    fallback as for the run's turns), for the query rewrite or the rerank step; None without
    entries. With ``site`` (an :class:`llm.metering.CallSite`: the run's tenant, agent, user,
    entry ids and the purpose) and ``in_thread``, each call is refused when the tenant's
    monthly budget is spent (``llm.metering.BudgetExceeded``) and its attempts are LLM calls
    of that purpose (not of the run: they do not count in the run's own totals)."""
    if not entries:
        return None
    from llm.types import ChatMessage

    if site is not None and in_thread is not None:
        from llm.metering import MeteredRoute

        metered = MeteredRoute(list(entries), site)

        async def metered_complete(prompt: str, max_output_tokens: int) -> str:
            completion = await metered.complete([ChatMessage(role="user", content=prompt)], in_thread=in_thread,
                                                max_output_tokens=max_output_tokens)
            return completion.message.content or ""

        return metered_complete
    from llm.router import Router

    router = Router(list(entries))

    async def complete(prompt: str, max_output_tokens: int) -> str:
        completion = await router.complete([ChatMessage(role="user", content=prompt)], [],
                                           max_output_tokens=max_output_tokens)
        return completion.message.content or ""

    return complete


def _rerank_endpoint(provider_id: int) -> Any:
    """The provider's resolved endpoint (its key decrypted), or None when it is gone. ORM:
    call on the run's database thread (tenant scope)."""
    from llm.embeddings import embedding_endpoint
    from llm.models import ModelProvider

    provider = ModelProvider.objects.filter(pk=provider_id).first()
    return embedding_endpoint(provider) if provider is not None else None


@dataclass(frozen=True, slots=True)
class RerankModel:
    """A binding's rerank model: ``model`` at the tenant's provider ``provider_id``
    (``/v1/rerank``, :func:`llm.embeddings.arerank`)."""

    provider_id: int
    model: str

    async def scores(self, query: str, passages: list[str], *, in_thread: InThread) -> list[float]:
        """One score per passage, in order.

        Raises:
            LookupError: the provider no longer exists.
            llm.embeddings.RerankError: the request failed.
        """
        from llm.embeddings import arerank

        endpoint = await in_thread(_rerank_endpoint)(self.provider_id)
        if endpoint is None:
            raise LookupError(f"the rerank model's provider {self.provider_id} no longer exists")
        return await arerank(endpoint, self.model, query, passages)


@dataclass(frozen=True, slots=True)
class Retrieval:
    """How one run retrieves: where (``scope``), on which thread (``in_thread``), and with
    the optional query rewrite and rerank step through the run's model (``rewrite`` /
    ``rerank``: a :data:`Complete`, or None for off) or a rerank model (``rerank_model``)."""

    scope: SearchScope
    in_thread: InThread
    rewrite: Complete | None = None
    rerank: Complete | None = None
    rerank_model: RerankModel | None = None

    async def hits(self, *, query: str, top_k: int, document_ids: list[int] | None = None,
                   tags: list[str] | None = None) -> list[Any]:
        """The best ``top_k`` hits for ``query`` (see :func:`search_sync`). A failing rewrite
        or rerank call is logged and skipped (the fused order stands)."""
        rewritten = ""
        if self.rewrite is not None:
            try:
                rewritten = (await self.rewrite(REWRITE_PROMPT.format(query=query), REWRITE_MAX_OUTPUT_TOKENS)).strip()
            except Exception:  # noqa: BLE001 - the search goes on without the third list
                logger.warning("knowledge: the query rewrite failed", exc_info=True)
        reranks = self.rerank is not None or self.rerank_model is not None
        wanted = max(top_k, RERANK_CANDIDATES) if reranks else top_k
        hits = await self.in_thread(search_sync)(self.scope, query=query, top_k=wanted, document_ids=document_ids,
                                                 tags=tags, rewritten=rewritten[:MAX_QUERY_CHARS])
        if reranks and len(hits) > 1:
            hits = await self._reranked(query, hits)
        return hits[:top_k]

    async def _reranked(self, query: str, hits: list[Any]) -> list[Any]:
        """``hits`` in the order of the rerank model's or the run model's scores (ties keep
        the fused order); the fused order when the step fails (logged)."""
        from knowledge.rerank import MAX_PASSAGE_CHARS, RERANK_MAX_OUTPUT_TOKENS, RERANK_PROMPT, parse_score

        passages = [f"{h.document_title} > {h.heading}\n{h.text}"[:MAX_PASSAGE_CHARS] for h in hits]
        try:
            if self.rerank_model is not None:
                scores = await self.rerank_model.scores(query, passages, in_thread=self.in_thread)
            elif self.rerank is not None:
                judge = self.rerank
                answers = await asyncio.gather(*(judge(RERANK_PROMPT.format(query=query, passage=p),
                                                       RERANK_MAX_OUTPUT_TOKENS) for p in passages))
                scores = [parse_score(a) for a in answers]
            else:
                return hits
        except Exception:  # noqa: BLE001 - keep the fused order
            logger.warning("knowledge: the rerank step failed", exc_info=True)
            return hits
        order = sorted(range(len(hits)), key=lambda i: (-scores[i], i))
        return [hits[i] for i in order]


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ToolError(f"filters.{name} must be a list of integer ids.", code="invalid_arguments")
    return value


def search_arguments(arguments: dict[str, Any], *, default_top_k: int) -> tuple[str, int, list[int], list[str]]:
    """The checked ``(query, top_k, document_ids, tags)`` of a ``knowledge_search`` call.

    Raises:
        ToolError: ``invalid_arguments``, with the reason for the model.
    """
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("query must be a non-empty string: what to look for.", code="invalid_arguments")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is too long ({len(query)} characters; at most {MAX_QUERY_CHARS}).",
                        code="invalid_arguments")
    top_k = arguments.get("top_k", default_top_k)
    if top_k is None:
        top_k = default_top_k
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
        raise ToolError(f"top_k must be an integer from 1 to {MAX_TOP_K}.", code="invalid_arguments")
    filters = arguments.get("filters") or {}
    if not isinstance(filters, dict):
        raise ToolError("filters must be an object: {document_ids?: [int], tags?: [string]}.", code="invalid_arguments")
    unknown = set(filters) - {"document_ids", "tags"}
    if unknown:
        raise ToolError(f"Unknown filters {sorted(unknown)}; use document_ids and tags.", code="invalid_arguments")
    document_ids = _int_list(filters.get("document_ids") or [], "document_ids")
    tags = filters.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ToolError("filters.tags must be a list of strings.", code="invalid_arguments")
    return query.strip(), top_k, document_ids, tags


class KnowledgeSearchTool(Tool):
    """``knowledge_search(query, filters?: {document_ids, tags}, top_k?)`` over one run's
    knowledge bases.

    Its results are outside data whichever knowledge base they come from (a user's own
    uploads, but also a tenant-wide knowledge base's fetched URLs and uploaded files, which
    the tenant's admins did not write): the tool is ``untrusted`` and the runner frames them.
    ``call_first``: the run's first model turn must call it (a binding with ``search_first``).
    """

    untrusted = True

    def __init__(self, *, exposed: str, retrieval: Retrieval, default_top_k: int,
                 numbers: Callable[[], CitationNumbers], description: str, call_first: bool = False) -> None:
        self.retrieval = retrieval
        self.default_top_k = default_top_k
        self.numbers = numbers
        self.call_first = call_first
        self.spec = ToolSpec(name=exposed, description=description, parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": QUERY_DESCRIPTION},
                "filters": {
                    "type": "object",
                    "description": "Optional: only these documents and/or documents with all of these tags.",
                    "properties": {
                        "document_ids": {"type": "array", "items": {"type": "integer"}},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K,
                          "description": f"How many passages (default {default_top_k})."},
            },
            "required": ["query"],
        })

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Search; numbered passages for the model, ``{"citations": [...]}`` as data.

        Raises:
            ToolError: ``invalid_arguments`` (bad query, top_k or filters, or past the REST
                search's limits: ``"Invalid arguments: filters.document_ids: Ensure this field has
                no more than 1000 elements."``) or ``search_failed``.
        """
        query, top_k, document_ids, tags = search_arguments(arguments, default_top_k=self.default_top_k)
        # The REST search's limits (NUL characters, 1,000 document ids, 20 tags of 64
        # characters): the one check the knowledge MCP server applies too. Past them a search
        # would fail in PostgreSQL and the model would read a database error.
        refusal = rest_limits_refusal(query=query, top_k=top_k, document_ids=document_ids, tags=tags,
                                      knowledge_base_ids=None)
        if refusal:
            raise ToolError(f"Invalid arguments: {refusal}", code="invalid_arguments")
        try:
            hits = await self.retrieval.hits(query=query, top_k=top_k, document_ids=document_ids, tags=tags)
        except ValueError as exc:  # the retrieval's own refusals (e.g. an embedding it cannot make)
            raise ToolError(f"The search failed: {exc}", code="search_failed") from exc
        # A knowledge base being re-embedded (a new embedding model): the model is told that
        # part of it was searched by words only.
        from knowledge.selectors import reembedding_notice_for

        scope = self.retrieval.scope
        notice = await self.retrieval.in_thread(reembedding_notice_for)(knowledge_base_ids=scope.knowledge_base_ids,
                                                                       user_id=scope.user_id)
        if not hits:
            return ToolResult(content="\n\n".join(filter(None, [NO_PASSAGES, notice])), data={"citations": []})
        numbers = self.numbers()
        async with numbers.lock:
            text, citations = passages_render(hits, numbers)
        return ToolResult(content="\n\n".join(filter(None, [text, notice])), data={"citations": citations})


async def context_passages(*, retrieval: Retrieval, query: str, top_k: int, numbers: CitationNumbers,
                           names: Sequence[str], focus: bool = False) -> list[ContextBlock]:
    """The retrieval before the first turn: the ``top_k`` passages for the user's message
    ``query`` as one :class:`ContextBlock` (none when nothing matches or the message is empty).

    The message is cut to :data:`MAX_QUERY_CHARS`. ``focus``: each passage's text is cut to its
    lines about the message (:func:`knowledge.focus.focus_passages`); the block's citations
    are the whole hits.
    """
    query = query.strip()[:MAX_QUERY_CHARS]
    if not query:
        return []
    hits = await retrieval.hits(query=query, top_k=top_k)
    if not hits:
        return []
    texts = focus_passages([h.text for h in hits], query) if focus else None
    async with numbers.lock:
        text, citations = passages_render(hits, numbers, texts)
    where = ", ".join(f"“{n}”" for n in names) or "the knowledge bases"
    title = f"Passages from {where} that may answer the user's message (use them when relevant). {CITE_NOTE}"
    return [ContextBlock(source="knowledge", title=title, text=text, data={"citations": citations}, untrusted=True)]
