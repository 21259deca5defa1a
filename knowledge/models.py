"""Knowledge bases, their documents and the documents' chunks (vectors + full text).

Every table is tenant-owned and under row-level security like the rest (tenants/rls.py).

- A :class:`KnowledgeBase` is tenant-wide (``owner`` null: configured by the tenant's admins,
  readable by every member) or a user's own (``owner`` set: only that user sees it, e.g. for
  their uploads from the chat app). It fixes the embedding model (a ``ModelProvider`` entry,
  a model name, the vector dimensions) and the chunking (size and overlap in characters).
- A :class:`Document` keeps its source bytes (so a re-ingest needs no re-upload), their
  SHA-256 (adding the same content again is no work) and its ingestion status.
- A :class:`Chunk` is a piece of a document with its heading path, an embedding, the
  fingerprint of the embedding model that made it, and a full-text vector.

Embedding fingerprints: a knowledge base's :attr:`KnowledgeBase.embedding_fingerprint` names
its current embedding model (provider entry id, vector size, re-embedding revision, model
name); every chunk records the fingerprint its vector was made with. When the knowledge base's
model changes (or an admin asks for a re-embedding because the model behind the provider entry
changed, which bumps ``embedding_revision``), the chunks whose fingerprint differs are
re-embedded by a Celery job (:func:`knowledge.reembedding.knowledge_base_reembed`), and the vector
search meanwhile compares only chunks of the current fingerprint (:mod:`knowledge.retrieval`):
two models' vectors are never compared, even when they have the same length.

Vectors: the ``embedding`` column is ``vector`` without a fixed dimension (the knowledge
base's model decides), ``dimensions`` says which; an HNSW index (cosine) per supported
dimension is a partial expression index, ``(embedding::vector(N)) WHERE dimensions = N``, and
queries use the same expression and predicate (:mod:`knowledge.retrieval`).

Full text: ``tsv`` is a generated column, ``to_tsvector('english', heading || ' ' || text)``,
with a GIN index. 'english' rather than 'simple' because stemming and stop words matter for
ranking ("ingesting" finds "ingestion"; "the" does not count) and the platform's own
documentation and UI are English; the price is worse lexical matching for other languages
(their chunks still match on exact words that the English stemmer leaves alone, and the vector
list does not depend on the language). A generated column needs one fixed configuration, so a
per-knowledge-base language would be a second column, not a setting.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Q
from pgvector.django import VectorField

from tenants.scoping import TenantOwnedModel

INDEXED_DIMENSIONS = (384, 768, 1024, 1536)
"""Vector sizes with an HNSW index (all-MiniLM-L6-v2: 384; nomic/bge-base: 768; bge-large/
e5-large: 1024; OpenAI text-embedding-3-small: 1536). Other sizes work, by exact scan."""
TEXT_SEARCH_CONFIG = "english"
"""The full-text configuration of ``Chunk.tsv`` and of queries (see the module docstring)."""
MAX_TAGS = 20
MAX_TAG_CHARS = 64


class SourceKind(models.TextChoices):
    FILE = "file", "File"
    URL = "url", "URL"
    TEXT = "text", "Text"


class DocumentStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    PARSING = "parsing", "Parsing"
    EMBEDDING = "embedding", "Embedding"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class KnowledgeBase(TenantOwnedModel):
    """Documents an agent can search, with the embedding model and chunking they are indexed with."""

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, help_text="What it holds; shown to the model with the search tool.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
        help_text="Blank: tenant-wide (admins manage it, every member can search it). Set: the user's own.",
    )
    embedding_provider = models.ForeignKey(
        "llm.ModelProvider", on_delete=models.RESTRICT, related_name="+",
        help_text="An OpenAI-compatible endpoint with /v1/embeddings.",
    )
    embedding_model = models.CharField(max_length=200)
    dimensions = models.PositiveIntegerField(help_text="Length of the model's vectors (384 for all-MiniLM-L6-v2).")
    chunk_size = models.PositiveIntegerField(default=500, help_text="Characters per chunk (100–8,000).")
    chunk_overlap = models.PositiveIntegerField(default=50, help_text="Characters repeated between chunks (≤ half the size).")
    embedding_revision = models.PositiveIntegerField(
        default=0, editable=False,
        help_text="Grows with every re-embedding asked for without a model change (the model behind the "
                  "provider entry changed); part of the embedding fingerprint.",
    )
    reembedding = models.BooleanField(
        default=False, editable=False,
        help_text="A re-embedding job is (or should be) under way: some chunks are not of the current embedding "
                  "model and are not vector-searched (knowledge.selectors.knowledge_base_embedding_progress).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], condition=Q(owner__isnull=True),
                                    name="knowledge_base_unique_tenant_name"),
            models.UniqueConstraint(fields=["tenant", "owner", "name"], condition=Q(owner__isnull=False),
                                    name="knowledge_base_unique_owner_name"),
            models.CheckConstraint(condition=Q(chunk_overlap__lt=models.F("chunk_size")),
                                   name="knowledge_base_overlap_below_size"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_tenant_wide(self) -> bool:
        return self.owner_id is None

    @property
    def embedding_fingerprint(self) -> str:
        """Which embedding model makes this knowledge base's vectors now:
        ``"<provider id>:<dimensions>:<revision>:<model name>"`` (≤ 240 characters). A chunk
        whose :attr:`Chunk.embedding_fingerprint` differs was embedded by another model (or
        the same model before an admin-requested re-embedding) and is not vector-searched.
        Migration 0003 writes the same format in SQL."""
        return embedding_fingerprint(provider_id=self.embedding_provider_id, dimensions=self.dimensions,
                                     revision=self.embedding_revision, model=self.embedding_model)


def embedding_fingerprint(*, provider_id: int, dimensions: int, revision: int, model: str) -> str:
    """The fingerprint string of an embedding model (see :attr:`KnowledgeBase.embedding_fingerprint`)."""
    return f"{int(provider_id)}:{int(dimensions)}:{int(revision)}:{model}"


class Document(TenantOwnedModel):
    """One source of a knowledge base (a file, a URL, a text) and its ingestion status.

    ``status`` goes queued → parsing → embedding → ready, or failed with ``status_reason``;
    only :mod:`knowledge.document_status` and the queueing services of :mod:`knowledge.services`
    write it. A document is identified in its knowledge base
    by ``(source_kind, source)``: adding that source again with other content replaces its
    chunks, with the same content does nothing.
    """

    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=300)
    source_kind = models.CharField(max_length=8, choices=SourceKind.choices)
    source = models.CharField(max_length=2000, help_text="The URL, the file name, or the text's title.")
    mime_type = models.CharField(max_length=200, blank=True)
    content = models.BinaryField(editable=False, help_text="The source bytes as added (or as last fetched).")
    content_sha256 = models.CharField(max_length=64, editable=False)
    size_bytes = models.PositiveBigIntegerField(default=0)
    tags = ArrayField(models.CharField(max_length=MAX_TAG_CHARS), default=list, blank=True, size=MAX_TAGS)
    status = models.CharField(max_length=16, choices=DocumentStatus.choices, default=DocumentStatus.QUEUED)
    status_reason = models.TextField(blank=True)
    char_count = models.PositiveIntegerField(default=0, help_text="Characters of extracted text.")
    chunk_count = models.PositiveIntegerField(default=0)
    embedded_count = models.PositiveIntegerField(default=0, help_text="Chunks embedded so far (progress).")
    reembedding = models.BooleanField(
        default=False, editable=False,
        help_text="True while the knowledge base's re-embedding job holds the document (status embedding); "
                  "an ingestion queued meanwhile clears it and takes over.",
    )
    chat_session_id = models.BigIntegerField(
        null=True, blank=True, editable=False,
        help_text="The chat the document was last added from (the chat app's 'Add to knowledge'): its status "
                  "events go to that chat's event stream. No foreign key: sessions sit above knowledge.",
    )
    generation = models.PositiveIntegerField(
        default=0, editable=False,
        help_text="Grows with every (re-)ingestion queued; an ingestion task of an older generation stops.",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    ingested_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-updated_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["knowledge_base", "source_kind", "source"],
                                    name="knowledge_document_unique_source"),
        ]
        indexes = [GinIndex(fields=["tags"], name="knowledge_document_tags")]

    def __str__(self) -> str:
        return self.title


class Chunk(TenantOwnedModel):
    """A piece of a document: its text, its heading path, its embedding and its full-text vector."""

    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="+")
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    position = models.PositiveIntegerField(help_text="0-based order in the document.")
    heading = models.TextField(blank=True, help_text="The heading path above the chunk, joined with ' > '.")
    text = models.TextField()
    char_count = models.PositiveIntegerField()
    token_count = models.PositiveIntegerField(help_text="Estimated tokens (llm.tokens.estimate_text_tokens).")
    embedding = VectorField(help_text="L2-normalised; length = dimensions.")
    dimensions = models.PositiveSmallIntegerField()
    embedding_fingerprint = models.CharField(
        max_length=256, help_text="The embedding model that made ``embedding`` (KnowledgeBase.embedding_fingerprint).")
    tsv = models.GeneratedField(
        expression=SearchVector("heading", "text", config=TEXT_SEARCH_CONFIG),
        output_field=SearchVectorField(), db_persist=True,
    )

    class Meta(TenantOwnedModel.Meta):
        ordering = ["document_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["document", "position"], name="knowledge_chunk_unique_position"),
        ]
        indexes = [
            GinIndex(fields=["tsv"], name="knowledge_chunk_tsv"),
            models.Index(fields=["knowledge_base"], name="knowledge_chunk_kb"),
            # the re-embedding job's stale chunks and its progress (n of m) per knowledge base
            models.Index(fields=["knowledge_base", "embedding_fingerprint"], name="knowledge_chunk_kb_fingerprint"),
            # + one partial HNSW index per INDEXED_DIMENSIONS, created by migration 0001 as SQL:
            # Django renders an expression index with an operator class without the parentheses
            # a cast needs, ((embedding::vector(384)) vector_cosine_ops).
        ]

    def __str__(self) -> str:
        return f"chunk:{self.pk} {self.document_id}#{self.position}"
