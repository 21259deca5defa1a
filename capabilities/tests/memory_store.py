"""An in-memory :class:`capabilities.tools.SessionStore` for tests of tools and of the runner
(tools reach a session's artifacts and todos only through this port)."""

from __future__ import annotations

from capabilities.tools import SessionStore, StoredArtifact


class MemoryToolStore(SessionStore):
    """The session data tools may touch (:class:`capabilities.tools.SessionStore`) in memory:
    ``artifacts`` ``{artifact id (from 500): (session id, name, mime type, data)}``, ``todos``
    ``{session id: todos}``."""

    def __init__(self) -> None:
        self.artifacts: dict[int, tuple[int, str, str, bytes]] = {}
        self.todos: dict[int, list[dict[str, str]]] = {}

    async def artifact_create(self, *, tenant_id: int, session_id: int, run_id: int | None,
                              tool_call_id: int | None, name: str, mime_type: str, data: bytes) -> StoredArtifact:
        artifact_id = 500 + len(self.artifacts)
        self.artifacts[artifact_id] = (session_id, name, mime_type, data)
        return StoredArtifact(artifact_id=artifact_id, name=name, mime_type=mime_type, size_bytes=len(data))

    async def artifact_text(self, *, session_id: int, artifact_id: int) -> tuple[str, str, str | None] | None:
        found = self.artifacts.get(artifact_id)
        if found is None or found[0] != session_id:
            return None
        return found[1], found[2], found[3].decode("utf-8", errors="replace")

    async def todos_replace(self, *, session_id: int, todos: list[dict[str, str]]) -> list[dict[str, str]]:
        self.todos[session_id] = list(todos)
        return self.todos[session_id]
