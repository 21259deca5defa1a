"""Rows for the knowledge tests: providers, knowledge bases, and chunks with given vectors
(inserted directly, for tests about storage, indexes and isolation rather than ingestion)."""

from __future__ import annotations

import hashlib
import math
import random

from knowledge.models import Chunk, Document, KnowledgeBase
from llm.models import ModelProvider


def provider(tenant, base_url: str = "http://127.0.0.1:9/v1", name: str = "test embedder") -> ModelProvider:
    """The tenant's embedding provider at ``base_url`` (made once per name; no validation:
    tests point it at local ports)."""
    existing = ModelProvider.all_tenants.filter(tenant=tenant, name=name).first()
    if existing is not None:
        if existing.base_url != base_url:
            existing.base_url = base_url
            existing.save(update_fields=["base_url"])
        return existing
    return ModelProvider.all_tenants.create(tenant=tenant, name=name, base_url=base_url)


def knowledge_base(tenant, name: str = "Handbook", *, owner=None, base_url: str = "http://127.0.0.1:9/v1",
                   dimensions: int = 384, chunk_size: int = 500, chunk_overlap: int = 50) -> KnowledgeBase:
    return KnowledgeBase.all_tenants.create(
        tenant=tenant, name=name, owner=owner, embedding_provider=provider(tenant, base_url),
        embedding_model="all-minilm-l6-v2", dimensions=dimensions, chunk_size=chunk_size, chunk_overlap=chunk_overlap)


def document(kb: KnowledgeBase, title: str = "Doc", *, status: str = "ready", tags=()) -> Document:
    content = title.encode()
    return Document.all_tenants.create(
        tenant_id=kb.tenant_id, knowledge_base=kb, title=title, source_kind="text", source=title,
        mime_type="text/markdown", content=content, content_sha256=hashlib.sha256(content).hexdigest(),
        size_bytes=len(content), tags=list(tags), status=status)


def unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def random_unit(rng: random.Random, dimensions: int = 384) -> list[float]:
    return unit([rng.gauss(0.0, 1.0) for _ in range(dimensions)])


def chunks(doc: Document, texts: list[str], vectors: list[list[float]], *, heading: str = "") -> list[Chunk]:
    """Chunks of ``doc`` with these texts and vectors, positions from 0."""
    kb = doc.knowledge_base
    return Chunk.all_tenants.bulk_create([
        Chunk(tenant_id=doc.tenant_id, knowledge_base_id=kb.pk, document=doc, position=i, heading=heading, text=t,
              char_count=len(t), token_count=len(t) // 4 + 1, embedding=v, dimensions=len(v),
              embedding_fingerprint=kb.embedding_fingerprint)
        for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
    ])
