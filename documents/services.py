"""Writes of documents (called by the ``doc_write`` tool). All need a tenant scope.

Every write locks the row, applies a pure edit from :mod:`documents.markdown`, checks the
size cap and bumps ``version`` by one. Errors are :class:`DocumentError` with a message for
the model and a ``code``: ``not_found``, ``ambiguous``, ``invalid_arguments``, ``too_large``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from documents import markdown
from documents.models import MAX_CONTENT_CHARS, MAX_TITLE_CHARS, Document
from documents.selectors import document_filter_for_run


class DocumentError(Exception):
    """A document operation failed in a way the caller (the model) can fix."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _check_content(content: str) -> None:
    if len(content) > MAX_CONTENT_CHARS:
        raise DocumentError(f"A document may hold at most {MAX_CONTENT_CHARS:,} characters; this edit would make "
                            f"it {len(content):,}.", code="too_large")


def document_create(*, tenant_id: int, session_id: int, run_id: int | None, title: str, content: str) -> Document:
    """Create a document in ``session_id`` (version 1).

    Raises:
        DocumentError: ``invalid_arguments`` (empty or over-long title, non-string content) or ``too_large``.
    """
    if not isinstance(title, str) or not title.strip():
        raise DocumentError("`title` must be a non-empty string.", code="invalid_arguments")
    if len(title.strip()) > MAX_TITLE_CHARS:
        raise DocumentError(f"`title` may have at most {MAX_TITLE_CHARS} characters.", code="invalid_arguments")
    if not isinstance(content, str):
        raise DocumentError("`content` must be a string of Markdown.", code="invalid_arguments")
    _check_content(content)
    document = Document(tenant_id=tenant_id, session_id=session_id, title=title.strip(), content=content,
                        created_by_run_id=run_id, updated_by_run_id=run_id)
    document.full_clean(exclude=["session", "tenant", "created_by_run", "updated_by_run", "content"])
    document.save()
    return document


@transaction.atomic
def _document_update(*, document_id: int, session_id: int, user_id: int | None, run_id: int | None,
                     edit: Callable[[str], str]) -> Document:
    document = (Document.objects.select_for_update(of=("self",))
                .filter(document_filter_for_run(session_id=session_id, user_id=user_id), pk=document_id).first())
    if document is None:
        raise DocumentError(f"There is no document {document_id}; op 'list' shows the documents you can use.",
                            code="not_found")
    try:
        content = edit(document.content)
    except markdown.MarkdownEditError as exc:
        raise DocumentError(exc.message, code=exc.code) from exc
    _check_content(content)
    Document.objects.filter(pk=document.pk).update(content=content, version=F("version") + 1, updated_by_run_id=run_id,
                                                   updated_at=timezone.now())
    document.refresh_from_db()
    return document


def document_append(*, document_id: int, session_id: int, user_id: int | None, run_id: int | None,
                    content: str) -> Document:
    """Append ``content`` on a new line at the end of the document."""
    if not isinstance(content, str) or not content:
        raise DocumentError("`content` must be a non-empty string of Markdown.", code="invalid_arguments")

    def edit(text: str) -> str:
        if not text:
            return content
        return text + ("" if text.endswith("\n") else "\n") + content

    return _document_update(document_id=document_id, session_id=session_id, user_id=user_id, run_id=run_id, edit=edit)


def document_patch_section(*, document_id: int, session_id: int, user_id: int | None, run_id: int | None,
                           section: str, content: str) -> Document:
    """Replace the body of the section headed ``section`` (see :func:`documents.markdown.replace_section`)."""
    if not isinstance(content, str):
        raise DocumentError("`content` must be a string of Markdown.", code="invalid_arguments")
    return _document_update(document_id=document_id, session_id=session_id, user_id=user_id, run_id=run_id,
                            edit=lambda text: markdown.replace_section(text, section, content))


def document_patch_text(*, document_id: int, session_id: int, user_id: int | None, run_id: int | None,
                        old_text: str, new_text: str) -> Document:
    """Replace the one occurrence of ``old_text`` (errors if none or several)."""
    return _document_update(document_id=document_id, session_id=session_id, user_id=user_id, run_id=run_id,
                            edit=lambda text: markdown.replace_text(text, old_text, new_text))
