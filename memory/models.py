"""Long-term memory: durable facts and preferences an agent keeps about one user.

A :class:`Memory` belongs to one (tenant, user, agent): it is never shown to another user, and
row-level security keeps it in its tenant. :class:`MemoryExtraction` is a session's
watermark: the last message already read by extraction, so nothing is extracted twice.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from pgvector.django import VectorField

from tenants.scoping import TenantOwnedModel


class MemoryCategory(models.TextChoices):
    FACT = "fact"
    PREFERENCE = "preference"


class Memory(TenantOwnedModel):
    """One durable fact or preference about a user, as one sentence, with its embedding.

    ``embedding`` is a ``vector`` without a fixed dimension (the embedding model decides:
    ``dimensions``); recall compares only memories embedded by the same model, with cosine
    distance over L2-normalised vectors.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.CASCADE, related_name="memories")
    text = models.TextField(help_text="One sentence about the user, as the agent reads it.")
    category = models.CharField(max_length=16, choices=MemoryCategory.choices, default=MemoryCategory.FACT)
    embedding = VectorField(help_text="The text's embedding (dimensions: see `dimensions`).")
    dimensions = models.PositiveSmallIntegerField(help_text="Length of `embedding`.")
    embedding_model = models.CharField(max_length=200, help_text="The model that embedded `text`.")
    source_session = models.ForeignKey(
        "agent_sessions.ChatSession", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The session it was last extracted from.",
    )
    replaced_text = models.TextField(
        blank=True, help_text="What this memory said before its last update, or the memory it replaced.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(
        auto_now_add=True, db_index=True,
        help_text="Last written or confirmed by an extraction; retention counts from here.",
    )
    last_used_at = models.DateTimeField(null=True, blank=True, help_text="Last given to a run at its start.")

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-updated_at", "-id"]
        verbose_name = "memory"
        verbose_name_plural = "memories"
        indexes = [models.Index(fields=["tenant", "user", "agent", "dimensions"], name="memory_owner_idx")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user", "agent", "text"], name="memory_unique_text"),
        ]

    def __str__(self) -> str:
        return self.text[:80]


class MemoryExtraction(TenantOwnedModel):
    """A session's extraction state: its watermark, and failures waiting for a retry."""

    session = models.OneToOneField("agent_sessions.ChatSession", on_delete=models.CASCADE, related_name="+")
    last_message_id = models.BigIntegerField(
        default=0, help_text="Messages with an id up to this one have been read by extraction.",
    )
    extracted_at = models.DateTimeField(null=True, blank=True, help_text="Last successful extraction.")
    failures = models.PositiveIntegerField(default=0, help_text="Failed attempts in a row on the current batch.")
    last_error = models.TextField(blank=True)
    retry_after = models.DateTimeField(null=True, blank=True, help_text="No new attempt before this time.")
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="An extraction holds the session until this time (one at a time).",
    )

    class Meta(TenantOwnedModel.Meta):
        verbose_name = "memory extraction"

    def __str__(self) -> str:
        return f"session {self.session_id} up to message {self.last_message_id}"
