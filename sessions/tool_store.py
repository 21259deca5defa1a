"""The session data tools may touch: the runner's implementation of ``capabilities``' port.

Tools live below ``sessions`` in the layer order, so they never import it; the runner puts
:data:`SESSION_TOOL_STORE` into every :class:`capabilities.tools.ToolContext` it builds, and
tools call it through ``context.session_store()``.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.db import transaction
from django.db.models import F, Func, JSONField, Value

from capabilities.tools import SessionStore, StoredArtifact
from sessions.models import Artifact, ChatSession, Todo, ToolCall
from sessions.services import artifact_create


class SessionToolStore(SessionStore):
    """Artifacts and todos in PostgreSQL (``sessions`` models), each call on a worker thread.

    Stateless: one instance (:data:`SESSION_TOOL_STORE`) serves every run.
    """

    async def artifact_create(
        self, *, tenant_id: int, session_id: int, run_id: int | None, tool_call_id: int | None,
        name: str, mime_type: str, data: bytes,
    ) -> StoredArtifact:
        """Store ``data`` (≤ 20 MiB, cut beyond) with :func:`sessions.services.artifact_create`."""
        artifact = await database_sync_to_async(artifact_create, thread_sensitive=False)(
            tenant_id=tenant_id, session_id=session_id, run_id=run_id, tool_call_id=tool_call_id,
            name=name, mime_type=mime_type, data=data,
        )
        return StoredArtifact(artifact_id=artifact.pk, name=artifact.name, mime_type=artifact.mime_type,
                              size_bytes=artifact.size_bytes)

    async def artifact_text(self, *, session_id: int, artifact_id: int) -> tuple[str, str, str | None] | None:
        """``(name, mime_type, text)`` of the session's artifact, text None when not UTF-8; None when absent."""
        return await database_sync_to_async(_artifact_text)(session_id=session_id, artifact_id=artifact_id)

    async def tool_call_log_save(self, *, tool_call_id: int, entries: list[dict[str, Any]]) -> None:
        """Append ``entries`` to the ToolCall's ``server_log`` (one UPDATE, in the run's tenant)."""
        if entries:
            await database_sync_to_async(_tool_call_log_append)(tool_call_id=tool_call_id, entries=entries)

    async def todos_replace(self, *, session_id: int, todos: list[dict[str, str]]) -> list[dict[str, str]]:
        """Replace the session's Todo rows with ``todos`` in one transaction (the session row locked)."""
        return await database_sync_to_async(_todos_replace)(session_id=session_id, todos=todos)


SESSION_TOOL_STORE: SessionStore = SessionToolStore()
"""The store the runner gives every tool call."""


def _tool_call_log_append(*, tool_call_id: int, entries: list[dict[str, Any]]) -> None:
    """``server_log || entries`` in the database (no read-modify-write race with another save)."""
    ToolCall.objects.filter(pk=tool_call_id).update(
        server_log=Func(F("server_log"), Value(entries, output_field=JSONField()), function="", arg_joiner=" || ",
                        output_field=JSONField()))


def _artifact_text(*, session_id: int, artifact_id: int) -> tuple[str, str, str | None] | None:
    artifact = Artifact.objects.filter(pk=artifact_id, session_id=session_id).first()
    if artifact is None:
        return None
    raw = bytes(artifact.content)
    if not artifact.is_text:
        try:
            return artifact.name, artifact.mime_type, raw.decode("utf-8")
        except UnicodeDecodeError:
            return artifact.name, artifact.mime_type, None
    return artifact.name, artifact.mime_type, raw.decode("utf-8", errors="replace")


def _todos_replace(*, session_id: int, todos: list[dict[str, str]]) -> list[dict[str, str]]:
    with transaction.atomic():
        session = ChatSession.objects.select_for_update(no_key=True).get(pk=session_id)
        Todo.objects.filter(session=session).delete()
        Todo.objects.bulk_create(
            [Todo(tenant_id=session.tenant_id, session=session, position=i, **t) for i, t in enumerate(todos)]
        )
    return todos
