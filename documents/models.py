"""Documents: Markdown an agent writes with ``doc_write`` and a user reads in the API."""

from __future__ import annotations

from django.db import models

from tenants.scoping import TenantOwnedModel

MAX_CONTENT_CHARS = 1_000_000
"""A document holds at most one million characters (~250k tokens)."""
MAX_TITLE_CHARS = 200


class Document(TenantOwnedModel):
    """A Markdown document owned by a session's tenant, written by the session's runs.

    Belongs to one chat session (deleted with it) and so to that session's user: the API shows
    a user the documents of their own sessions, and ``doc_write`` sees the documents of the
    sessions of the user whose message started the run. ``version`` starts at 1 and grows by
    one with every write (create counts as the first).
    """

    session = models.ForeignKey("agent_sessions.ChatSession", on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=MAX_TITLE_CHARS)
    content = models.TextField(blank=True, default="", help_text="Markdown.")
    version = models.PositiveIntegerField(default=1)
    created_by_run = models.ForeignKey(
        "agent_sessions.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    updated_by_run = models.ForeignKey(
        "agent_sessions.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["tenant", "session"])]

    def __str__(self) -> str:
        return f"document:{self.pk} {self.title}"

    @property
    def line_count(self) -> int:
        from documents.markdown import split_lines

        return len(split_lines(self.content))
