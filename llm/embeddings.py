"""Text embeddings through any OpenAI-compatible ``POST /v1/embeddings`` endpoint, and rerank
scores through the ``POST /v1/rerank`` endpoint that rerank models are served with.

Embeddings are used by knowledge bases (chunks and queries) and memories; rerank scores by a
knowledge search's optional rerank step when it is given a rerank model (:func:`arerank`). A provider is a
:class:`~llm.models.ModelProvider` (its base URL and encrypted key) or an already resolved
:class:`EmbeddingEndpoint`; the model name and, for models that can shorten their vectors
(OpenAI's ``text-embedding-3-*``), ``dimensions`` are the caller's (a knowledge base stores
them next to its provider).

* :func:`embed_texts` (sync: Celery tasks, services) and :func:`aembed_texts` (async: tool
  calls, the run-start hook) send the texts in batches of :data:`BATCH_SIZE` through the
  ``openai`` SDK, on a client built as the chat adapter builds its own
  (:func:`llm.providers.sdk_client`: no SDK retries, no key read from the environment, every
  connect checked against the outbound address rules, :mod:`llm.netrules`).
* Nothing is rebuilt per call: a provider's resolved endpoint (its key decrypted) is kept in
  an LRU of :data:`ENDPOINT_CACHE_SIZE` keyed by what it was resolved from (the provider's id,
  tenant, name, wire API, base URL and a hash of its encrypted key, so an edited provider is
  a new key and is resolved afresh). Every request runs on one background event loop of the
  process (:func:`_embeddings_loop`; :func:`embed_texts` waits for it, :func:`aembed_texts`
  awaits it from the caller's loop), which keeps the SDK clients with their keep-alive
  connections in an LRU of :data:`CLIENT_CACHE_SIZE`, keyed by base URL, key, timeouts and the
  outbound address rules in force (a changed rule set never reuses a connection checked under
  the old one). Measured
  (bench/knowledge_search.py): a one-text query embedding took ~150 ms with a new client per
  call (connection set-up and the SDK's first request), ~20–25 ms on a kept one.
* Every vector comes back L2-normalised (unit length; the knowledge base compares them by
  cosine distance), in the order of the texts.
* Every failure is an :class:`EmbeddingError` whose ``error_class`` is one of
  :data:`llm.errors.ERROR_CLASSES` (classified as chat errors are) and whose message is
  redacted: the provider's key and anything shaped like a secret never appear.

The embedded default: ``scripts/llm_server.py`` with ``LLM_ROLE=embeddings`` serves
all-MiniLM-L6-v2 (:data:`DEFAULT_EMBEDDING_MODEL`, 384 dimensions) with llama.cpp at
``settings.EMBEDDINGS_BASE_URL``; :func:`default_embedding_provider` is each tenant's
provider for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from llm.errors import ErrorClass, LLMError, classify_error, redact_secrets

if TYPE_CHECKING:
    from llm.models import ModelProvider
    from tenants.models import Tenant

_T = TypeVar("_T")

DEFAULT_EMBEDDING_MODEL: Final[str] = "all-minilm-l6-v2"
"""The embedded embedding model's id (sentence-transformers/all-MiniLM-L6-v2 on llama.cpp)."""
DEFAULT_EMBEDDING_DIMENSIONS: Final[int] = 384
"""Length of :data:`DEFAULT_EMBEDDING_MODEL`'s vectors."""
DEFAULT_EMBEDDING_PROVIDER_NAME: Final[str] = "Embedded embedder"
"""Name of each tenant's provider for the embedded model (:func:`default_embedding_provider`)."""

BATCH_SIZE: Final[int] = 64
"""Texts per request (OpenAI accepts up to 2048; llama.cpp handles a batch in one request)."""
CONNECT_TIMEOUT_SECONDS: Final[float] = 10.0
"""TCP/TLS connect timeout of one request."""
READ_TIMEOUT_SECONDS: Final[float] = 120.0
"""Longest wait for one batch's answer. The embedded model spends ~150 ms of CPU on a
~500-character text (bench/embedding_throughput.py): a batch of 64 takes ~5 s on two idle
cores, 30 s and more when other processes share them."""
MAX_TEXT_CHARS: Final[int] = 32_000
"""Longest text accepted (≈ 8k tokens, OpenAI's input limit). Longer texts are a caller's
bug (knowledge chunks are ~500 characters); the embedded model itself reads at most 512
tokens of a text."""

KEYLESS_API_KEY: Final[str] = "none"
"""Sent when a provider has no key (local servers), as for chat (llm.selectors)."""
ENDPOINT_CACHE_SIZE: Final[int] = 32
"""Resolved provider endpoints (decrypted keys) kept in memory, least recently used dropped."""
CLIENT_CACHE_SIZE: Final[int] = 32
"""SDK clients (each with its connection pool) kept, least recently used closed."""


class EmbeddingError(LLMError):
    """An embeddings request failed.

    Attributes:
        error_class: One of :data:`llm.errors.ERROR_CLASSES` (``network``, ``timeout``,
            ``auth``, ``not_found``, ``bad_request``, ``server``, ``other`` …).
        status_code: The provider's HTTP status, or None.
        message: What went wrong, at most ~500 characters, secrets redacted.
    """

    def __init__(self, error_class: ErrorClass, message: str, *, status_code: int | None = None) -> None:
        message = redact_secrets(message)
        super().__init__(message)
        self.error_class: ErrorClass = error_class
        self.status_code = status_code
        self.message = message


@dataclass(frozen=True, slots=True)
class EmbeddingEndpoint:
    """Where and how to send embeddings requests: a provider with its key decrypted."""

    name: str
    """The provider's display name (in error messages)."""
    base_url: str
    """OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8082/v1``."""
    api_key: str = ""
    """Secret; "" for local servers. Never shown in ``repr``."""
    api: str = "openai"
    """The provider's wire API; only ``openai`` has an embeddings endpoint."""

    def __repr__(self) -> str:
        return f"EmbeddingEndpoint(name={self.name!r}, base_url={self.base_url!r}, api={self.api!r})"


_endpoints: OrderedDict[tuple, EmbeddingEndpoint] = OrderedDict()
_endpoints_lock = threading.Lock()


def _endpoint_key(provider: ModelProvider) -> tuple:
    """What a resolved endpoint depends on; any edit of the provider (URL, key, API, name)
    changes it. The encrypted key enters as a SHA-256 (it changes with every re-encryption)."""
    secret = hashlib.sha256(provider.api_key_encrypted.encode()).hexdigest() if provider.api_key_encrypted else ""
    return (provider.pk, provider.tenant_id, provider.name, provider.api, provider.base_url, secret)


def _cached_endpoint(provider: ModelProvider) -> EmbeddingEndpoint | None:
    key = _endpoint_key(provider)
    with _endpoints_lock:
        endpoint = _endpoints.get(key)
        if endpoint is not None:
            _endpoints.move_to_end(key)
        return endpoint


def embedding_endpoint(provider: ModelProvider) -> EmbeddingEndpoint:
    """``provider``'s endpoint with its key decrypted, from the LRU of
    :data:`ENDPOINT_CACHE_SIZE` when the provider is unchanged since it was resolved (see the
    module docstring); a miss reads the tenant and decrypts (database access: sync only).

    Raises:
        tenants.crypto.SecretDecryptError: the key cannot be decrypted (nothing is cached).
    """
    cached = _cached_endpoint(provider)
    if cached is not None:
        return cached
    from tenants.crypto import secret_decrypt

    api_key = secret_decrypt(tenant=provider.tenant, ciphertext=provider.api_key_encrypted)
    endpoint = EmbeddingEndpoint(name=provider.name, base_url=provider.base_url, api_key=api_key, api=provider.api)
    with _endpoints_lock:
        _endpoints[_endpoint_key(provider)] = endpoint
        while len(_endpoints) > ENDPOINT_CACHE_SIZE:
            _endpoints.popitem(last=False)
    return endpoint


def _client_new(key: tuple) -> Any:
    from llm.providers import sdk_client

    base_url, api_key, connect_timeout, read_timeout, _rules = key
    return sdk_client(api="openai", base_url=base_url, api_key=api_key, connect_timeout_seconds=connect_timeout,
                      read_timeout_seconds=read_timeout)


_clients: OrderedDict[tuple, Any] = OrderedDict()
"""The kept clients; used only on the embeddings loop's thread."""


def _client(endpoint: EmbeddingEndpoint, read_timeout_seconds: float) -> Any:
    """The kept ``openai.AsyncOpenAI`` for ``endpoint`` (made on first use). Call on the
    embeddings loop only; a client pushed out of the LRU is closed once a request on it would
    have timed out."""
    from django.conf import settings

    rules = (tuple(getattr(settings, "OUTBOUND_ALLOWED_HOSTS", ())), tuple(getattr(settings, "OUTBOUND_ALLOWED_CIDRS", ())))
    key = (endpoint.base_url, endpoint.api_key or KEYLESS_API_KEY, CONNECT_TIMEOUT_SECONDS, float(read_timeout_seconds),
           rules)
    client = _clients.get(key)
    if client is not None:
        _clients.move_to_end(key)
        return client
    client = _clients[key] = _client_new(key)
    loop = asyncio.get_running_loop()
    while len(_clients) > CLIENT_CACHE_SIZE:
        _, old = _clients.popitem(last=False)
        loop.call_later(CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS, lambda c=old: loop.create_task(c.close()))
    return client


_loop_state: dict[str, Any] = {}
_loop_lock = threading.Lock()


def _embeddings_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for embeddings requests (a daemon thread running it, started
    on first use and again in a forked child, whose copy of the thread is gone)."""
    with _loop_lock:
        loop = _loop_state.get("loop")
        thread = _loop_state.get("thread")
        if loop is not None and _loop_state.get("pid") == os.getpid() and thread is not None and thread.is_alive():
            return loop
        _clients.clear()  # a forked child's copies belong to the parent's loop
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="llm-embeddings-loop", daemon=True)
        thread.start()
        _loop_state.update(loop=loop, thread=thread, pid=os.getpid())
        return loop


async def _on_embeddings_loop(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Await ``coroutine`` run on the embeddings loop (directly when already on it); cancelling
    the caller cancels it there."""
    loop = _embeddings_loop()
    if asyncio.get_running_loop() is loop:
        return await coroutine
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))


def default_embedding_provider(tenant: Tenant, *, sync_url: bool = False) -> ModelProvider:
    """The tenant's provider for the embedded embedding model, created if missing.

    It is the provider named :data:`DEFAULT_EMBEDDING_PROVIDER_NAME`, pointing at
    ``settings.EMBEDDINGS_BASE_URL`` when created (the tenant's admins may change it later);
    with ``sync_url`` its base URL is set back to the setting (``seed_demo`` does).

    Requires the tenant's scope (or the system scope) for the database.
    """
    from django.conf import settings

    from llm.models import ModelProvider
    from llm.services import provider_save

    provider = ModelProvider.all_tenants.filter(tenant=tenant, name=DEFAULT_EMBEDDING_PROVIDER_NAME).first()
    if provider is None:
        return provider_save(tenant=tenant, name=DEFAULT_EMBEDDING_PROVIDER_NAME, base_url=settings.EMBEDDINGS_BASE_URL)
    if sync_url and provider.base_url != settings.EMBEDDINGS_BASE_URL:
        return provider_save(tenant=tenant, provider=provider, base_url=settings.EMBEDDINGS_BASE_URL)
    return provider


def _checked_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a sequence of strings, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
        if not text.strip():
            raise ValueError(f"texts[{i}] is empty: an empty text has no embedding")
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"texts[{i}] has {len(text):,} characters; at most {MAX_TEXT_CHARS:,} are accepted")
    return list(texts)


def _unit(vector: list[float], *, where: str) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if not math.isfinite(norm) or norm == 0.0:
        raise EmbeddingError("other", f"{where}: the provider returned a zero or non-finite vector")
    return [x / norm for x in vector]


def _vectors(payload: Any, *, count: int, dimensions: int | None, where: str) -> list[list[float]]:
    """The vectors of ``payload`` (the response's parsed JSON, ``{"data": [{"index": i,
    "embedding": [float, …]}, …]}``) in input order, each checked and L2-normalised."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise EmbeddingError("other", f"{where}: expected {count} embeddings, got {got}")
    by_index: dict[int, list[float]] = {}
    for position, item in enumerate(data):
        item = item if isinstance(item, dict) else {}
        index = item.get("index", position)
        vector = item.get("embedding")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count or index in by_index:
            raise EmbeddingError("other", f"{where}: embedding index {index!r} is out of range or repeated")
        if (not isinstance(vector, list) or not vector
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector)):
            raise EmbeddingError("other", f"{where}: embedding {index} is not a list of numbers")
        by_index[index] = [float(x) for x in vector]
    vectors = [by_index[i] for i in range(count)]
    expected = dimensions or len(vectors[0])
    for i, vector in enumerate(vectors):
        if len(vector) != expected:
            raise EmbeddingError(
                "bad_request" if dimensions else "other",
                f"{where}: embedding {i} has {len(vector)} dimensions, expected {expected}",
            )
    return [_unit(v, where=where) for v in vectors]


async def _endpoint_of(provider: ModelProvider | EmbeddingEndpoint) -> EmbeddingEndpoint:
    if isinstance(provider, EmbeddingEndpoint):
        return provider
    cached = _cached_endpoint(provider)
    if cached is not None:
        return cached
    from channels.db import database_sync_to_async  # closes the thread's old connections around the call

    return await database_sync_to_async(embedding_endpoint, thread_sensitive=False)(provider)


async def aembed_texts(
    provider: ModelProvider | EmbeddingEndpoint,
    model: str,
    texts: Sequence[str],
    *,
    dimensions: int | None = None,
    batch_size: int = BATCH_SIZE,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> list[list[float]]:
    """Embed ``texts`` with ``model`` at ``provider``; the async variant of :func:`embed_texts`.

    Args:
        provider: A :class:`~llm.models.ModelProvider` (its key is decrypted in a thread) or
            an :class:`EmbeddingEndpoint`.
        model: The provider's embedding model name (e.g. :data:`DEFAULT_EMBEDDING_MODEL`,
            ``text-embedding-3-small``).
        texts: Non-empty strings of at most :data:`MAX_TEXT_CHARS` characters; ``[]`` → ``[]``.
        dimensions: Sent as the API's ``dimensions`` (models that can shorten their vectors);
            every vector must then have this length. None: the model's own length.
        batch_size: Texts per request (positive).
        read_timeout_seconds: Longest wait for one request's answer (positive).

    Returns:
        One unit-length vector (a list of floats) per text, in order.

    Raises:
        TypeError, ValueError: bad arguments (before any request).
        EmbeddingError: the provider failed, could not be reached (or is not allowed, see
            :mod:`llm.netrules`), timed out, or answered something that is not one vector
            per text.
    """
    texts = _checked_texts(texts)
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise ValueError(f"dimensions must be a positive int or None, got {dimensions!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    _check_timeout(read_timeout_seconds)
    if not texts:
        return []
    endpoint = await _openai_endpoint(provider, error=EmbeddingError, what="embeddings")

    return await _on_embeddings_loop(_request_vectors(endpoint, model, texts, dimensions=dimensions,
                                                      batch_size=batch_size,
                                                      read_timeout_seconds=float(read_timeout_seconds)))


def _check_timeout(read_timeout_seconds: Any) -> None:
    """Raises ValueError unless ``read_timeout_seconds`` is a positive finite number."""
    if not (isinstance(read_timeout_seconds, (int, float)) and math.isfinite(read_timeout_seconds)
            and read_timeout_seconds > 0):
        raise ValueError(f"read_timeout_seconds must be positive finite seconds, got {read_timeout_seconds!r}")


async def _openai_endpoint(provider: ModelProvider | EmbeddingEndpoint, *, error: type[EmbeddingError],
                           what: str) -> EmbeddingEndpoint:
    """The endpoint of ``provider``; an ``error`` of class ``bad_request`` when its API is not
    OpenAI-compatible (the only one with ``what`` endpoints here)."""
    endpoint = await _endpoint_of(provider)
    if endpoint.api != "openai":
        raise error("bad_request", f"provider {endpoint.name!r} speaks the {endpoint.api} API, which has no {what} "
                                   "endpoint")
    return endpoint


async def _json_answer(request: Callable[[], Awaitable[Any]], *, endpoint: EmbeddingEndpoint, where: str,
                       error: type[EmbeddingError]) -> Any:
    """The parsed JSON body of the raw response ``request()`` awaits (anything with
    ``content``). Every SDK or transport failure is an ``error`` classified as chat errors are,
    its message prefixed with ``where`` and the endpoint's key redacted; a body that is not
    JSON is an ``error`` of class ``other``."""
    try:
        response = await request()
        content = response.content
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every SDK/transport failure is classified
        classified = classify_error(exc)
        message = redact_secrets(f"{where}: {classified}", secrets=[endpoint.api_key])
        raise error(classified.error_class, message, status_code=classified.status_code) from None
    try:
        return json.loads(content)
    except ValueError:
        raise error("other", f"{where}: the response is not JSON") from None


async def _request_vectors(endpoint: EmbeddingEndpoint, model: str, texts: list[str], *, dimensions: int | None,
                           batch_size: int, read_timeout_seconds: float) -> list[list[float]]:
    """The requests of :func:`aembed_texts` (checked arguments), on the embeddings loop."""
    client = _client(endpoint, read_timeout_seconds)
    vectors: list[list[float]] = []
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        where = f"embeddings from {endpoint.name!r} ({model})"
        request: dict[str, Any] = {"model": model, "input": batch, "encoding_format": "float"}
        if dimensions is not None:
            request["dimensions"] = dimensions
        # The raw body, parsed here: the SDK's typed objects cost ~1 ms of CPU per 384
        # floats (openai._models.construct_type per number), a query's whole client side.
        payload = await _json_answer(lambda r=request: client.embeddings.with_raw_response.create(**r),
                                     endpoint=endpoint, where=where, error=EmbeddingError)
        vectors.extend(_vectors(payload, count=len(batch), dimensions=dimensions, where=where))
    return vectors


def embed_texts_start(
    provider: ModelProvider | EmbeddingEndpoint,
    model: str,
    texts: Sequence[str],
    *,
    dimensions: int | None = None,
    batch_size: int = BATCH_SIZE,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> concurrent.futures.Future[list[list[float]]]:
    """Start :func:`embed_texts` and return at once: the request runs on the process's
    embeddings loop while the caller does something else (knowledge search runs its lexical
    query meanwhile, :mod:`knowledge.retrieval`).

    A :class:`~llm.models.ModelProvider`'s key is resolved (database, decryption) here, on the
    caller's thread, before the request starts; everything else happens on the loop.

    Returns:
        A :class:`concurrent.futures.Future` whose ``result()`` is one unit-length vector per
        text, in order, or raises what :func:`aembed_texts` raises (``TypeError`` /
        ``ValueError`` for bad arguments, :class:`EmbeddingError` for a failed request).
        ``cancel()`` cancels the request. Arguments: see :func:`aembed_texts`.

    Raises:
        RuntimeError: called inside a running event loop (await :func:`aembed_texts` there).
    """
    endpoint = _endpoint_off_loop(provider, "embed_texts() was called inside a running event loop; await "
                                            "aembed_texts() instead")
    return asyncio.run_coroutine_threadsafe(aembed_texts(
        endpoint, model, texts, dimensions=dimensions, batch_size=batch_size, read_timeout_seconds=read_timeout_seconds,
    ), _embeddings_loop())


def _endpoint_off_loop(provider: ModelProvider | EmbeddingEndpoint, refusal: str) -> EmbeddingEndpoint:
    """The endpoint of ``provider`` (its key resolved here, on the caller's thread), for a sync
    wrapper about to hand its request to the embeddings loop.

    Raises:
        RuntimeError: ``refusal``, when called inside a running event loop (waiting on the
            embeddings loop from one would block it).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(refusal)
    return provider if isinstance(provider, EmbeddingEndpoint) else embedding_endpoint(provider)


def embed_texts(
    provider: ModelProvider | EmbeddingEndpoint,
    model: str,
    texts: Sequence[str],
    *,
    dimensions: int | None = None,
    batch_size: int = BATCH_SIZE,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> list[list[float]]:
    """Embed ``texts`` with ``model`` at ``provider``: one unit-length vector per text, in order.

    Synchronous (Celery tasks, services): runs :func:`aembed_texts` on the process's
    embeddings loop (:func:`_embeddings_loop`, where the clients are kept) and waits for it
    (:func:`embed_texts_start` without the wait); it must not be called from inside a running
    event loop, which it would block (await :func:`aembed_texts` there). Arguments, result and
    errors: see :func:`aembed_texts`.

    Raises:
        RuntimeError: called inside a running event loop.
    """
    return embed_texts_start(provider, model, texts, dimensions=dimensions, batch_size=batch_size,
                             read_timeout_seconds=read_timeout_seconds).result()


RERANK_MAX_DOCUMENTS: Final[int] = 100
"""Documents one rerank request may score (a knowledge search sends at most 20)."""


class RerankError(EmbeddingError):
    """A rerank request failed; attributes as :class:`EmbeddingError` (a subclass, so code
    that handles a failed retrieval model catches both)."""


def _rerank_scores(payload: Any, *, count: int, where: str) -> list[float]:
    """The scores of ``payload`` (the parsed JSON, ``{"results": [{"index": i,
    "relevance_score": s}, …]}``) in input order: one finite number per document."""
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list) or len(results) != count:
        got = len(results) if isinstance(results, list) else "no"
        raise RerankError("other", f"{where}: expected {count} results, got {got}")
    by_index: dict[int, float] = {}
    for position, item in enumerate(results):
        item = item if isinstance(item, dict) else {}
        index = item.get("index", position)
        score = item.get("relevance_score")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count or index in by_index:
            raise RerankError("other", f"{where}: result index {index!r} is out of range or repeated")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise RerankError("other", f"{where}: result {index} has no finite relevance_score")
        by_index[index] = float(score)
    return [by_index[i] for i in range(count)]


async def arerank(
    provider: ModelProvider | EmbeddingEndpoint,
    model: str,
    query: str,
    documents: Sequence[str],
    *,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> list[float]:
    """How relevant each of ``documents`` is to ``query``, by the rerank model ``model``.

    One ``POST {base_url}/rerank`` with ``{"model", "query", "documents", "top_n"}`` (``top_n``
    = every document), answered with ``{"results": [{"index", "relevance_score"}, …]}``: the
    rerank API of Jina AI (``https://api.jina.ai/v1``) and Cohere (``https://api.cohere.com/v2``),
    also served by vLLM and by llama.cpp's server started with ``--reranking`` (base URL
    ``http://host:port/v1``). A cross-encoder reads the query and a document together, which
    is why it judges relevance better than the distance between two separate embeddings
    (Nogueira and Cho, "Passage Re-ranking with BERT", 2019). Sent on the same kept clients
    and event loop as embeddings, checked against the outbound address rules alike.

    Args:
        provider: A :class:`~llm.models.ModelProvider` (OpenAI-compatible) or an
            :class:`EmbeddingEndpoint`.
        model: The provider's rerank model name (e.g. ``jina-reranker-v2-base-multilingual``,
            ``rerank-v3.5``, ``BAAI/bge-reranker-v2-m3``).
        query: A non-empty string of at most :data:`MAX_TEXT_CHARS` characters.
        documents: At most :data:`RERANK_MAX_DOCUMENTS` non-empty strings of at most
            :data:`MAX_TEXT_CHARS` characters each; ``[]`` → ``[]`` without a request.
        read_timeout_seconds: Longest wait for the answer (positive).

    Returns:
        One score per document, in the order of ``documents`` (higher is more relevant; the
        scale is the model's: Cohere and Jina give 0–1, llama.cpp raw logits).

    Raises:
        TypeError, ValueError: bad arguments (before any request).
        RerankError: the provider failed, could not be reached (or is not allowed, see
            :mod:`llm.netrules`), timed out, or answered something that is not one finite
            score per document.
    """
    [query] = _checked_texts([query])
    documents = _checked_texts(documents)
    if len(documents) > RERANK_MAX_DOCUMENTS:
        raise ValueError(f"{len(documents)} documents; at most {RERANK_MAX_DOCUMENTS} are reranked in one request")
    _check_timeout(read_timeout_seconds)
    if not documents:
        return []
    endpoint = await _openai_endpoint(provider, error=RerankError, what="rerank")
    return await _on_embeddings_loop(_request_scores(endpoint, model, query, documents,
                                                     read_timeout_seconds=float(read_timeout_seconds)))


async def _request_scores(endpoint: EmbeddingEndpoint, model: str, query: str, documents: list[str], *,
                          read_timeout_seconds: float) -> list[float]:
    """The request of :func:`arerank` (checked arguments), on the embeddings loop."""
    import httpx

    client = _client(endpoint, read_timeout_seconds)
    where = f"rerank by {endpoint.name!r} ({model})"
    body = {"model": model, "query": query, "documents": documents, "top_n": len(documents)}
    # The SDK's documented way to reach an endpoint it has no method for.
    payload = await _json_answer(lambda: client.post("/rerank", cast_to=httpx.Response, body=body),
                                 endpoint=endpoint, where=where, error=RerankError)
    return _rerank_scores(payload, count=len(documents), where=where)


def rerank(
    provider: ModelProvider | EmbeddingEndpoint,
    model: str,
    query: str,
    documents: Sequence[str],
    *,
    read_timeout_seconds: float = READ_TIMEOUT_SECONDS,
) -> list[float]:
    """:func:`arerank`, synchronous (services, the search API): runs on the process's
    embeddings loop and waits. A :class:`~llm.models.ModelProvider`'s key is resolved on the
    caller's thread (database). Arguments, result and errors: see :func:`arerank`.

    Raises:
        RuntimeError: called inside a running event loop (await :func:`arerank` there).
    """
    endpoint = _endpoint_off_loop(provider, "rerank() was called inside a running event loop; await arerank() instead")
    return asyncio.run_coroutine_threadsafe(
        arerank(endpoint, model, query, documents, read_timeout_seconds=read_timeout_seconds), _embeddings_loop(),
    ).result()


__all__ = [
    "BATCH_SIZE",
    "DEFAULT_EMBEDDING_DIMENSIONS",
    "DEFAULT_EMBEDDING_MODEL",
    "DEFAULT_EMBEDDING_PROVIDER_NAME",
    "EmbeddingEndpoint",
    "EmbeddingError",
    "RERANK_MAX_DOCUMENTS",
    "RerankError",
    "aembed_texts",
    "arerank",
    "default_embedding_provider",
    "embed_texts",
    "embed_texts_start",
    "embedding_endpoint",
    "rerank",
]
