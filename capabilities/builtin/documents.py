"""``doc_write``: Markdown documents the agent creates, reads and edits (the ``documents`` app).

Documents belong to the session's tenant and session; a run sees the documents of all
sessions of the user who started it. Every write publishes ``artifact_updated`` with
``{document_id, title, op, version}``.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from capabilities.builtin.registration import register_builtin
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

MAX_GET_CHARS = 15_000
"""``get`` returns at most this many characters (below the runner's 16,000-character artifact
threshold, so the text stays inline); ask for a line range or a section for more."""

DESCRIPTION = """Create, read and edit Markdown documents that the user can open later (reports, plans, notes).

Pick one `op`:
- `create` (title, content): a new document; returns its id.
- `append` (id, content): add content at the end.
- `get` (id, optional section OR line_start/line_end): read the whole document, one section
  (a heading and everything under it), or a range of lines (1-based, inclusive).
- `patch` (id, section, content): replace everything under the heading `section` (its
  subsections too; the heading stays). Give the heading text, e.g. "Results", or "## Results"
  to pick a level.
- `patch` (id, old_text, new_text): replace text that occurs exactly once (copy it from `get`).
- `list`: your documents, newest first.
Prefer `patch` and `append` over re-creating a document."""

_OPS = ("create", "append", "get", "patch", "list")


@register_builtin("doc_write")
class DocWriteTool(Tool):
    """The ``doc_write`` tool (see :data:`DESCRIPTION`).

    Errors (``ToolError.code``): ``invalid_arguments``, ``not_found`` (unknown id, section or
    text; ids of other users and tenants answer the same), ``ambiguous`` (a heading or text
    that matches more than once), ``too_large`` (over 1,000,000 characters).
    Side effects: writes ``documents.Document`` rows; publishes ``artifact_updated``.
    Requires the tenant scope the runner sets.
    """

    spec = ToolSpec(
        name="doc_write",
        description=DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "op": {"type": "string", "enum": list(_OPS)},
                "id": {"type": "integer", "description": "The document id (create and list return it)."},
                "title": {"type": "string", "description": "For create: the title (≤ 200 characters)."},
                "content": {"type": "string", "description": "Markdown for create, append and patch by section."},
                "section": {"type": "string", "description": "A heading's text, for get and patch."},
                "line_start": {"type": "integer", "minimum": 1, "description": "For get: first line (1-based)."},
                "line_end": {"type": "integer", "minimum": 1, "description": "For get: last line (inclusive)."},
                "old_text": {"type": "string", "description": "For patch: exact text that occurs once."},
                "new_text": {"type": "string", "description": "For patch: its replacement."},
            },
            "required": ["op"],
        },
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        op = arguments.get("op")
        if op not in _OPS:
            raise ToolError(f"`op` must be one of {', '.join(_OPS)}; got {op!r}.", code="invalid_arguments")
        from documents.services import DocumentError

        try:
            if op == "list":
                return await _list(context)
            if op == "create":
                document = await _db(_create)(context, arguments)
            else:
                document_id = _int(arguments, "id")
                if op == "get":
                    return await _db(_get)(context, document_id, arguments)
                document = await _db(_write)(context, op, document_id, arguments)
        except DocumentError as exc:
            raise ToolError(exc.message, code=exc.code) from exc

        if context.publish is not None:
            await context.publish("artifact_updated", {
                "document_id": document.pk, "title": document.title, "op": op, "version": document.version,
            })
        verb = {"create": "Created", "append": "Appended to", "patch": "Patched"}[op]
        return ToolResult(
            content=f"{verb} document:{document.pk} «{document.title}» (version {document.version}, "
                    f"{document.line_count} lines).",
            data={"document_id": document.pk, "title": document.title, "version": document.version,
                  "lines": document.line_count, "op": op},
        )


def _db(func: Any) -> Any:
    return database_sync_to_async(func, thread_sensitive=False)


def _int(arguments: dict[str, Any], key: str, *, required: bool = True) -> int | None:
    value = arguments.get(key)
    if value is None and not required:
        return None
    if isinstance(value, str) and value.strip().removeprefix("document:").isdigit():
        value = int(value.strip().removeprefix("document:"))
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolError(f"`{key}` must be an integer.", code="invalid_arguments")
    return value


def _create(context: ToolContext, arguments: dict[str, Any]) -> Any:
    from documents.services import document_create

    return document_create(tenant_id=context.tenant_id, session_id=context.session_id, run_id=context.run_id,
                           title=arguments.get("title"), content=arguments.get("content", ""))


def _write(context: ToolContext, op: str, document_id: int, arguments: dict[str, Any]) -> Any:
    from documents import services

    who = {"document_id": document_id, "session_id": context.session_id, "user_id": context.user_id,
           "run_id": context.run_id}
    if op == "append":
        return services.document_append(**who, content=arguments.get("content"))
    has_section = arguments.get("section") is not None
    has_text = arguments.get("old_text") is not None
    if has_section == has_text:
        raise ToolError("`patch` needs either `section` and `content`, or `old_text` and `new_text`.",
                        code="invalid_arguments")
    if has_section:
        return services.document_patch_section(**who, section=arguments["section"], content=arguments.get("content"))
    return services.document_patch_text(**who, old_text=arguments["old_text"], new_text=arguments.get("new_text"))


def _get(context: ToolContext, document_id: int, arguments: dict[str, Any]) -> ToolResult:
    from documents import markdown
    from documents.selectors import document_get_for_run
    from documents.services import DocumentError

    document = document_get_for_run(document_id=document_id, session_id=context.session_id, user_id=context.user_id)
    if document is None:
        raise DocumentError(f"There is no document {document_id}; op 'list' shows the documents you can use.",
                            code="not_found")
    section = arguments.get("section")
    line_start, line_end = _int(arguments, "line_start", required=False), _int(arguments, "line_end", required=False)
    total = document.line_count
    try:
        if section is not None:
            if line_start is not None or line_end is not None:
                raise ToolError("Give either `section` or `line_start`/`line_end`, not both.", code="invalid_arguments")
            text, first, last = markdown.section_text(document.content, section)
        else:
            text, first, last = markdown.line_range(document.content, line_start, line_end)
    except markdown.MarkdownEditError as exc:
        raise DocumentError(exc.message, code=exc.code) from exc
    note = ""
    if len(text) > MAX_GET_CHARS:
        text = text[:MAX_GET_CHARS]
        shown_last = first + text.count("\n")
        note = (f"\n[… cut at {MAX_GET_CHARS:,} characters (line {shown_last}); "
                f"read on with line_start={shown_last}]")
    header = f"document:{document.pk} «{document.title}», version {document.version}, lines {first}–{last} of {total}:"
    return ToolResult(content=f"{header}\n\n{text}{note}", data={
        "document_id": document.pk, "title": document.title, "version": document.version,
        "line_start": first, "line_end": last, "lines": total,
    })


async def _list(context: ToolContext) -> ToolResult:
    from documents.selectors import document_list_for_run

    documents = await _db(document_list_for_run)(session_id=context.session_id, user_id=context.user_id)
    if not documents:
        return ToolResult(content="No documents yet (create one with op 'create').", data=[])
    rows = [{"document_id": d.pk, "title": d.title, "version": d.version, "session_id": d.session_id,
             "updated_at": d.updated_at.isoformat(timespec="seconds")} for d in documents]
    lines = [f"- document:{r['document_id']} «{r['title']}» (version {r['version']}, updated {r['updated_at']}"
             + (", this session" if r["session_id"] == context.session_id else "") + ")" for r in rows]
    return ToolResult(content="Documents:\n" + "\n".join(lines), data=rows)
