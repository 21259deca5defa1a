"""Writes behind the chat app's chat management: rename, soft delete and restore, editing a
message or regenerating an answer (by truncation), retry, a new chat with a summary, and
attachments.

Every function requires a tenant scope (the caller's: the API views set it) and takes
objects the caller already checked belong to the user (``sessions.selectors``'s
``*_for_user`` lookups); errors are :class:`ApplicationError` (``{message, extra}``).

Editing and regenerating **truncate** the conversation (no branches): the chosen run and
every later run of the session are marked ``superseded_at`` (hidden from the chat, kept for
usage accounting and the console), their messages are deleted from the history the model
sees, and the (edited) message is posted again as a new run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from agents.models import CapabilityBinding
from capabilities.mcp.resources import MAX_URI_CHARS
from sessions.models import (
    ACTIVE_RUN_STATUSES,
    Artifact,
    ChatSession,
    LLMCallBody,
    Message,
    MessageRole,
    Run,
)
from sessions.services import artifact_create, chat_session_create, chat_title_from, message_post, run_cancel

logger = logging.getLogger(__name__)

MAX_TITLE_CHARS = 200


@transaction.atomic
def chat_session_rename(*, session: ChatSession, title: str) -> ChatSession:
    """Set the session's title (stripped, 1-200 characters).

    Raises:
        ApplicationError: 400 for an empty or over-long title.
    """
    title = (title or "").strip()
    if not title:
        raise ApplicationError("The title is empty.")
    if len(title) > MAX_TITLE_CHARS:
        raise ApplicationError(f"The title is longer than {MAX_TITLE_CHARS} characters.")
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    session.title = title
    session.save(update_fields=["title", "updated_at"])
    return session


@transaction.atomic
def chat_session_delete(*, session: ChatSession) -> ChatSession:
    """Soft-delete the session: ``deleted_at`` is set, so it leaves every list and the API
    answers 404 for it, its runs, artifacts and approvals. Its active runs are cancelled
    first. Rows are kept (the console still shows them) until :func:`chat_sessions_purge` removes
    them ``CHAT_PURGE_AFTER_DAYS`` later; :func:`chat_session_restore` undoes it until then."""
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    for run in Run.objects.filter(session=session, status__in=ACTIVE_RUN_STATUSES, parent_tool_call__isnull=True,
                                  steered_into__isnull=True):
        try:
            run_cancel(run=run)
        except ApplicationError:  # ended meanwhile
            pass
    if session.deleted_at is None:
        session.deleted_at = timezone.now()
        ChatSession.objects.filter(pk=session.pk).update(deleted_at=session.deleted_at)  # keeps updated_at
    return session


@transaction.atomic
def chat_session_restore(*, session: ChatSession) -> ChatSession:
    """Undo :func:`chat_session_delete` (``deleted_at`` back to null). Idempotent."""
    ChatSession.objects.filter(pk=session.pk).update(deleted_at=None)
    session.refresh_from_db()
    return session


def _truncate_from(*, session: ChatSession, run: Run) -> None:
    """Supersede ``run`` and every later user run of ``session`` (locked by the caller) and
    delete their messages from the history (a compaction whose cursor was one of them goes
    with it, by cascade: its summary covered removed text)."""
    later = Run.objects.filter(session=session, parent_tool_call__isnull=True, superseded_at__isnull=True,
                               pk__gte=run.pk)
    ids = list(later.values_list("pk", flat=True))
    Message.objects.filter(session=session, run_id__in=ids).delete()
    Run.objects.filter(pk__in=ids).update(superseded_at=timezone.now())


def _lock_idle_session(session: ChatSession) -> ChatSession:
    session = ChatSession.objects.select_for_update(no_key=True).get(pk=session.pk)
    if Run.objects.filter(session=session, status__in=ACTIVE_RUN_STATUSES).exists():
        raise ApplicationError("The agent is still answering; stop it first.", status_code=409)
    return session


def _check_user_run(run: Run, session: ChatSession) -> None:
    if run.session_id != session.pk or run.parent_tool_call_id is not None or run.superseded_at is not None:
        raise ApplicationError("This message is not part of the chat any more.", status_code=409)


@transaction.atomic
def run_edit_and_resend(*, run: Run, user: AbstractBaseUser, content: str) -> Run:
    """Edit the user message of ``run`` and send it again (truncation: ``run`` and every later
    run leave the chat; see the module docstring).

    Args:
        run: a user's run (not a skill's sub-run, not superseded) of the caller's session.
        content: the new message (the rules of :func:`sessions.services.message_post`).

    Returns:
        The new queued run (``run_queued`` on commit; a worker starts it).

    Raises:
        ApplicationError: 409 while a run of the session is active or when ``run`` was already
            superseded; 400 for empty or over-long content.
    """
    session = _lock_idle_session(run.session)
    run = Run.objects.get(pk=run.pk)
    _check_user_run(run, session)
    if not (content or "").strip():
        raise ApplicationError("The message is empty.")
    _truncate_from(session=session, run=run)
    content, options = message_resources_again(session=session, content=content)  # its MCP resources read again
    return message_post(session=session, user=user, content=content, request_options=options)


@transaction.atomic
def run_retry(*, run: Run, user: AbstractBaseUser) -> Run:
    """Answer the last message again: ``run`` (the session's last user run, in any final
    state: a failed run's Retry, or Regenerate on a completed one) is superseded and its
    message posted again as a new run.

    Raises:
        ApplicationError: 409 when a run is active, ``run`` is not the last one of the chat, or
            it was already superseded.
    """
    session = _lock_idle_session(run.session)
    run = Run.objects.get(pk=run.pk)
    _check_user_run(run, session)
    last_id = (Run.objects.filter(session=session, parent_tool_call__isnull=True, superseded_at__isnull=True)
               .order_by("-pk").values_list("pk", flat=True).first())
    if last_id != run.pk:
        raise ApplicationError("Only the last answer can be regenerated.", status_code=409)
    _truncate_from(session=session, run=run)
    content, options = message_resources_again(session=session, content=run.input)  # its MCP resources read again
    return message_post(session=session, user=user, content=content, request_options=options)


def session_regenerate(*, session: ChatSession, user: AbstractBaseUser) -> Run:
    """:func:`run_retry` for the session's last user run.

    Raises:
        ApplicationError: 409 when the chat has no message yet (or as :func:`run_retry`).
    """
    last = (Run.objects.filter(session=session, parent_tool_call__isnull=True, superseded_at__isnull=True)
            .order_by("-pk").first())
    if last is None:
        raise ApplicationError("There is no answer to regenerate yet.", status_code=409)
    return run_retry(run=last, user=user)


SUMMARY_LAST_MESSAGES = 12
SUMMARY_MESSAGE_CHARS = 1500
SUMMARY_MAX_CHARS = 12_000


def chat_summary_text(*, session: ChatSession) -> str:
    """A summary of ``session`` to start a new chat with: the latest compaction summary if
    the session has one, then its last :data:`SUMMARY_LAST_MESSAGES` user/assistant messages
    quoted (each cut to 1,500 characters; at most 12,000 characters in all). No model call."""
    from sessions.models import Compaction

    parts: list[str] = []
    compaction = (Compaction.objects.filter(session=session, status="succeeded").order_by("-id")
                  .values_list("summary", flat=True).first())
    if compaction:
        parts.append(f"Summary of the earlier conversation:\n{compaction.strip()}")
    rows = list(
        Message.objects.filter(session=session, role__in=[MessageRole.USER, MessageRole.ASSISTANT],
                               run__parent_tool_call__isnull=True)
        .exclude(content="").order_by("-run_id", "-position").values_list("role", "content")[:SUMMARY_LAST_MESSAGES]
    )
    if rows:
        lines = []
        for role, content in reversed(rows):
            text = content.strip()
            if len(text) > SUMMARY_MESSAGE_CHARS:
                text = text[:SUMMARY_MESSAGE_CHARS] + " […]"
            lines.append(f"{'User' if role == MessageRole.USER else 'Assistant'}: {text}")
        parts.append("The last messages:\n" + "\n\n".join(lines))
    text = "\n\n".join(parts)
    if len(text) > SUMMARY_MAX_CHARS:
        text = "[…]\n" + text[-SUMMARY_MAX_CHARS:]
    return text


@transaction.atomic
def chat_session_continue_with_summary(*, session: ChatSession, user: AbstractBaseUser) -> tuple[ChatSession, str]:
    """Open a new chat with the same agent, for a conversation that no longer fits the
    model (a run failed ``context_window``). Nothing is sent yet: the caller gets the draft
    first message (the summary of :func:`chat_summary_text` and a request to go on) to
    review and send.

    Returns:
        (the new session, the draft first message).

    Raises:
        ApplicationError: the agent is no longer active (400).
    """
    new = chat_session_create(user=user, agent=session.agent,
                              title=f"{(session.title or 'Chat')[:180]} (continued)")
    summary = chat_summary_text(session=session)
    draft = ("We are continuing an earlier chat that became too long. "
             f"{summary}\n\nPlease continue from here." if summary else "")
    return new, draft


def attachment_max_bytes() -> int:
    """``settings.ATTACHMENT_MAX_BYTES`` (default 10 MiB): the largest file a user may attach."""
    return int(getattr(settings, "ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024))


ATTACHMENT_INLINE_TEXT_CHARS = 8000
"""Text files up to this many characters are quoted in the message; longer ones are read by
the model through ``read_artifact``."""

MAX_ATTACHMENTS_PER_REQUEST = 10


def attachment_create(*, session: ChatSession, name: str, mime_type: str, data: bytes) -> Artifact:
    """Store an uploaded file as an artifact of ``session`` (``run`` null).

    Raises:
        ApplicationError: 413 when ``data`` is larger than :func:`attachment_max_bytes`
            (``extra.max_bytes``), 400 when it is empty.
    """
    limit = attachment_max_bytes()
    if len(data) > limit:
        raise ApplicationError(f"The file is larger than {limit // (1024 * 1024)} MB.", status_code=413,
                               extra={"max_bytes": limit, "name": name})
    if not data:
        raise ApplicationError("The file is empty.", extra={"name": name})
    clean_name = re.sub(r"[\x00-\x1f/\\]+", "_", (name or "attachment").strip())[:200] or "attachment"
    mime_type = (mime_type or "application/octet-stream").split(";")[0].strip().lower()[:100]
    return artifact_create(tenant_id=session.tenant_id, session_id=session.pk, name=clean_name,
                           mime_type=mime_type, data=data)


@transaction.atomic
def run_images_attach(*, run: Run, images: Sequence[tuple[str, str, bytes]]) -> Run:
    """Attach ``images`` (``[(name, mime type, bytes)]``) to the user message a just-created,
    still uncommitted run answers, as the chat app's attachments are: each stored as an artifact
    of the session (:func:`attachment_create`), its reference line
    (:func:`attachment_reference`) added to the message and the run's ``input``, so the runner
    sends the image with the message to route entries that take images
    (:mod:`sessions.runner.images`). Call it in the transaction that created the run (the run
    is handed to a worker on commit). Requires the run's tenant scope.

    Raises:
        ApplicationError: 413 an image over :func:`attachment_max_bytes`, 400 an empty one.
    """
    references = [attachment_reference(attachment_create(session=run.session, name=name, mime_type=mime_type,
                                                         data=data)) for name, mime_type, data in images]
    content = "\n".join([run.input, *references])
    Message.objects.filter(run=run, role=MessageRole.USER, content=run.input).update(content=content)
    run.input = content
    run.save(update_fields=["input"])
    return run


@transaction.atomic
def run_file_attach(*, run_id: int, name: str, mime_type: str, data: bytes) -> tuple[Artifact, str]:
    """Attach a file a run obtained for its user message (an MCP resource the person attached,
    read when the run starts: :mod:`capabilities.mcp.attached`) as :func:`run_images_attach`
    does. Requires the run's tenant scope.

    Returns:
        (the artifact, its reference line as added to the message).

    Raises:
        ApplicationError: 413 over :func:`attachment_max_bytes`, 400 when empty.
    """
    run = Run.objects.select_for_update(no_key=True).select_related("session").get(pk=run_id)
    artifact = attachment_create(session=run.session, name=name, mime_type=mime_type, data=data)
    line = attachment_reference(artifact)
    content = f"{run.input}\n{line}"
    Message.objects.filter(run=run, role=MessageRole.USER, content=run.input).update(content=content)
    run.input = content
    run.save(update_fields=["input"])
    return artifact, line


# --- MCP resources attached to a message -------------------------------------------------------

MAX_RESOURCES_PER_MESSAGE = 10
"""The most MCP resources one message may carry."""

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
"""An absolute URI (RFC 3986: a scheme, a colon, no whitespace); a template's ``{var}`` left
unfilled is refused separately."""
IMAGE_REFERENCE_LINE = re.compile(r'^\[image: artifact:\d+ "[^\n]*\]$')
"""An image attachment's reference line (:func:`attachment_reference`)."""
RESOURCE_LINE = re.compile(r"^\[resource: (\S+) (\S+)\]$")
"""The reference line of an attached resource in a message (groups: the server's alias, the URI)."""


def bound_mcp_servers(*, agent_id: int) -> list[CapabilityBinding]:
    """The agent's enabled ``mcp_server`` bindings of enabled servers, by binding id (tenant scope)."""
    return list(CapabilityBinding.objects.filter(agent_id=agent_id, kind="mcp_server", enabled=True,
                                                 mcp_server__enabled=True).select_related("mcp_server").order_by("pk"))


def _binding_of(ref: dict[str, Any], bound: list[CapabilityBinding], index: int) -> CapabilityBinding:
    """The bound binding a reference names (``binding`` id, or ``server``: the server's name or id)."""
    if ref.get("binding") not in (None, ""):
        found = [b for b in bound if str(b.pk) == str(ref["binding"])]
        named = f"binding {ref['binding']!r}"
    else:
        server = str(ref.get("server") or "").strip()
        found = [b for b in bound if server and server in (b.mcp_server.alias, b.mcp_server.name, str(b.mcp_server_id))]
        named = f"server {server!r}" if server else "no server"
    if not found:
        raise ApplicationError(f"resources[{index}]: {named} is not an MCP server of this chat's agent.",
                               extra={"field": f"resources[{index}]"})
    return found[0]


def message_resources(*, session: ChatSession, refs: list[Any],
                      bound: list[CapabilityBinding] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Check a posted message's ``resources`` against the chat's agent.

    Each names a bound, enabled MCP server of the chat's agent (``binding``: the binding's id, or
    ``server``: the server's alias, name or id) and an absolute URI. The run reads them when it
    starts (:mod:`capabilities.mcp.attached`); a URI the server does not know becomes a note the
    model reads. A reference line per resource goes into the message, so the model, the chat's
    history and the chat app (a chip) show what was attached.

    Args:
        refs: ``[{binding | server, uri}]`` as posted.
        bound: The agent's bound servers (:func:`bound_mcp_servers`), when the caller has them.

    Returns:
        ``(stored, lines)``: ``[{binding, server_id, server, uri}]`` for ``Run.request_options``,
        and the reference line of each (``[resource: <server> <uri>]``) for the message.

    Raises:
        ApplicationError: 400 naming the item: too many, not an object, an unknown server, a
            missing, over-long or relative URI, or a template's URI with ``{variables}`` left.
    """
    if len(refs) > MAX_RESOURCES_PER_MESSAGE:
        raise ApplicationError(f"A message may carry at most {MAX_RESOURCES_PER_MESSAGE} resources.")
    if bound is None:
        bound = bound_mcp_servers(agent_id=session.agent_id) if refs else []
    stored: list[dict[str, Any]] = []
    for index, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise ApplicationError(f"resources[{index}] must be an object {{binding or server, uri}}.")
        binding = _binding_of(ref, bound, index)
        uri = str(ref.get("uri") or "").strip()
        if not uri or len(uri) > MAX_URI_CHARS or not _URI.match(uri):
            raise ApplicationError(f"resources[{index}]: {uri[:100]!r} is not an absolute URI.",
                                   extra={"field": f"resources[{index}].uri"})
        if re.search(r"\{[^}]*\}", uri):
            raise ApplicationError(f"resources[{index}]: fill in the template's variables in {uri[:100]!r}.",
                                   extra={"field": f"resources[{index}].uri"})
        item = {"binding": binding.pk, "server_id": binding.mcp_server_id, "server": binding.mcp_server.alias,
                "uri": uri}
        if item not in stored:
            stored.append(item)
    return stored, [f"[resource: {item['server']} {item['uri']}]" for item in stored]


def message_resources_again(*, session: ChatSession, content: str) -> tuple[str, dict[str, Any] | None]:
    """A message posted again (edited, regenerated) with the resources its ``[resource: <server>
    <uri>]`` lines name, read again by the new run: ``(content, request options)``.

    The image lines the earlier run added after those lines (an image resource it read,
    :func:`run_file_attach`) are dropped, so the new run's image is not sent twice; a line whose
    server is no longer bound to the agent stays text (options: None when no line resolves).
    """
    lines = content.split("\n")
    marks = [i for i, line in enumerate(lines) if RESOURCE_LINE.match(line)]
    if not marks:
        return content, None
    tail = lines[marks[-1] + 1:]
    if tail and all(IMAGE_REFERENCE_LINE.match(line) for line in tail):
        lines = lines[:marks[-1] + 1]
    bound = bound_mcp_servers(agent_id=session.agent_id)
    stored: list[dict[str, Any]] = []
    for index in marks[:MAX_RESOURCES_PER_MESSAGE]:
        server, uri = RESOURCE_LINE.match(lines[index]).groups()  # type: ignore[union-attr]
        try:
            resolved, _ = message_resources(session=session, refs=[{"server": server, "uri": uri}], bound=bound)
        except ApplicationError:
            continue
        stored += [item for item in resolved if item not in stored]
    return "\n".join(lines), ({"resources": stored} if stored else None)


def attachment_reference(artifact: Artifact, data: bytes | None = None) -> str:
    """The text put into the user's message for an attachment, which is how the model is
    offered it:

    - a text file of at most :data:`ATTACHMENT_INLINE_TEXT_CHARS` characters: a reference
      line followed by its content in a fenced block;
    - an image: a reference line; the runner sends the image itself with the message to
      route entries that take images (:mod:`sessions.runner.images`), the others read the line;
    - anything else (binaries, long text): a reference line only; the model reads text
      through ``read_artifact`` (offered to every run of a session with artifacts).

    The line looks like ``[attachment: artifact:12 "notes.txt", text/plain, 1.2 kB]``
    (``[image: …]`` for images).
    """
    size = artifact.size_bytes
    human = f"{size} B" if size < 1000 else f"{size / 1000:.1f} kB" if size < 1_000_000 else f"{size / 1e6:.1f} MB"
    kind = "image" if artifact.mime_type.startswith("image/") else "attachment"
    name = artifact.name.replace('"', "'")
    line = f'[{kind}: artifact:{artifact.pk} "{name}", {artifact.mime_type}, {human}]'
    if artifact.is_text and data is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return line
        if len(text) <= ATTACHMENT_INLINE_TEXT_CHARS:
            fence = "````" if "```" in text else "```"
            return f"{line}\n{fence}\n{text.rstrip()}\n{fence}"
    return line



# --- titles from the first exchange -----------------------------------------------------------

TITLE_MAX_OUTPUT_TOKENS = 16
"""Output cap of the title request: a 3–6 word title is ~5–12 tokens in English."""
TITLE_EXCERPT_CHARS = 1500
"""The first message and the first answer are each cut to this many characters for the prompt."""
TITLE_MAX_WORDS = 12
"""A model's title with more words than this is not a title (the heuristic one stays)."""
TITLE_SYSTEM_PROMPT = (
    "You name chats. Reply with a title of 3 to 6 words for the conversation below: what it is "
    "about, in the language of the user's message. Only the title: no quotes, no final period, "
    "no preamble."
)

_TITLE_PREFIX = re.compile(r"^\s*(?:\*\*)?(?:chat\s+)?title\s*[:：-]\s*", re.IGNORECASE)
_TITLE_STRIP = "\"'“”‘’«»`*_#.。!！?？:;,- \t"


def chat_title_clean(text: str) -> str:
    """A model's answer to the title prompt as a title: the first non-empty line, without a
    "Title:" prefix, quotes, Markdown marks or final punctuation, whitespace collapsed, at
    most :data:`MAX_TITLE_CHARS` characters.

    Returns "" when that leaves nothing or more than :data:`TITLE_MAX_WORDS` words (the model
    answered something else than a title)."""
    line = next((raw.strip() for raw in str(text or "").splitlines() if raw.strip()), "")
    line = _TITLE_PREFIX.sub("", line)
    line = re.sub(r"\s+", " ", line.strip(_TITLE_STRIP)).strip()
    if not line or len(line.split(" ")) > TITLE_MAX_WORDS:
        return ""
    return line[:MAX_TITLE_CHARS]


def _title_exchange(session: ChatSession, run: Run) -> tuple[str, str] | None:
    """``(first user message, its answer)`` of ``run``, or None when either is missing."""
    first = (Message.objects.filter(session=session, run=run, role=MessageRole.USER)
             .order_by("position").values_list("content", flat=True).first())
    if not first or not run.reply.strip():
        return None
    return first, run.reply


def _title_messages(question: str, answer: str) -> list:
    from llm.types import ChatMessage

    def cut(text: str) -> str:
        text = text.strip()
        return text if len(text) <= TITLE_EXCERPT_CHARS else text[:TITLE_EXCERPT_CHARS] + " […]"

    return [
        ChatMessage(role="system", content=TITLE_SYSTEM_PROMPT),
        ChatMessage(role="user", content=f"User:\n{cut(question)}\n\nAssistant:\n{cut(answer)}\n\nTitle:"),
    ]


def chat_session_title_generate(*, session_id: int, run_id: int) -> str:
    """Ask the agent's route for a 3–6 word title of the chat's first exchange (``run``: the
    session's first completed run) and set it, unless the chat's title is no longer the one
    made from its first message (renamed by its user, or already titled by a model).

    The request: :data:`TITLE_SYSTEM_PROMPT` and the first message and answer (each cut to
    :data:`TITLE_EXCERPT_CHARS`), no tools, at most :data:`TITLE_MAX_OUTPUT_TOKENS` output
    tokens, through the route's entries in order with no retries (a fallback still moves on
    to the next entry). Each attempt is an LLM call of purpose ``title`` for the chat's agent
    and user (not of ``run``: it would show in the run's trace as a turn of its own), counted
    in usage and in the tenant's monthly budget (:mod:`llm.metering`). Any failure (the
    tenant's monthly budget spent: nothing asked, logged; no entry answered; an answer that is
    no title) keeps the current title.

    Returns:
        The new title, or "" when the title was left as it was.

    Emits ``session_titled`` ``{title}`` on commit (the chat app renames the chat in its list).
    Requires tenant scope; a deleted chat or a run of another session is left alone.
    """
    import dataclasses

    from llm.errors import LLMError
    from llm.metering import BudgetExceeded, CallSite, LLMCallPurpose, MeteredRoute
    from llm.selectors import route_entries, route_entry_config
    from sessions.events import event_publish_on_commit
    from tenants.models import Tenant

    session = ChatSession.objects.filter(pk=session_id, deleted_at__isnull=True).select_related("agent").first()
    run = Run.objects.filter(pk=run_id, session_id=session_id, status="completed",
                             parent_tool_call__isnull=True).first()
    if session is None or run is None:
        return ""
    exchange = _title_exchange(session, run)
    if exchange is None or session.title != chat_title_from(exchange[0])[:MAX_TITLE_CHARS]:
        return ""  # renamed, titled already, or nothing to name
    entries = route_entries(route_id=session.agent.route_id)
    if not entries:
        return ""
    tenant = Tenant.objects.get(pk=session.tenant_id)
    configs = [dataclasses.replace(route_entry_config(e, tenant=tenant, index=i), max_retries=0)
               for i, e in enumerate(entries)]
    route = MeteredRoute(configs, CallSite(
        tenant_id=session.tenant_id, purpose=LLMCallPurpose.TITLE, entry_ids=tuple(e.pk for e in entries),
        agent_id=session.agent_id, user_id=session.user_id,
    ))
    try:
        answer = route.complete_sync(_title_messages(*exchange), max_output_tokens=TITLE_MAX_OUTPUT_TOKENS).message.content
    except BudgetExceeded as exc:
        logger.info("chat %s: no title from the model: %s", session_id, exc)
        answer = ""
    except LLMError:
        answer = ""
    title = chat_title_clean(answer)
    if not title:
        return ""
    with transaction.atomic():
        locked = ChatSession.objects.select_for_update(no_key=True).filter(pk=session_id).first()
        if locked is None or locked.title != session.title or locked.deleted_at is not None:
            return ""  # renamed (or deleted) while the model answered
        ChatSession.objects.filter(pk=session_id).update(title=title)  # keeps updated_at: not an activity
        event_publish_on_commit(session_id=session_id, run_id=run_id, type="session_titled", data={"title": title})
    return title


# --- purging deleted chats --------------------------------------------------------------------

PURGE_BATCH = 500
"""Chats one purge hard-deletes at most (the next beat takes the rest)."""


def chat_purge_after_days() -> int:
    """``settings.CHAT_PURGE_AFTER_DAYS`` (default 30): days a deleted chat is kept (Undo in the
    chat app, the console) before it is purged; 0 keeps deleted chats for ever."""
    return int(getattr(settings, "CHAT_PURGE_AFTER_DAYS", 30))


def chat_sessions_purge(*, now=None) -> int:
    """Hard-delete chats soft-deleted more than :func:`chat_purge_after_days` days ago, every
    tenant's, with everything that belongs to them (messages, runs with their tool calls,
    approvals and compactions, artifacts, todos, documents: cascades) and their
    event stream in Redis. At most :data:`PURGE_BATCH` chats per call, oldest deletion first;
    each in its own transaction, in its tenant's scope, re-checked under a row lock (a chat
    restored meanwhile is kept; so is one with a run still active).

    The purged runs' LLM calls are kept (their ``run`` set NULL; agent, user, purpose, tokens
    and cost stay), so usage totals and the monthly budget are the same after a purge; their
    model call records (request and response bodies, :mod:`sessions.llm_bodies`) are deleted.

    Args:
        now: The current time (default ``timezone.now()``).

    Returns:
        How many chats were purged. Nothing at all when the setting is 0.
    """
    from datetime import timedelta

    from sessions.events import session_keys
    from tenants.scoping import system_scope, tenant_scope

    days = chat_purge_after_days()
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    # tenant-bypass: the purge finds every tenant's old deleted chats, then deletes each in its tenant.
    with system_scope():
        due = list(ChatSession.all_tenants.filter(deleted_at__lt=cutoff).order_by("deleted_at", "pk")
                   .values_list("pk", "tenant_id")[:PURGE_BATCH])
    purged = []
    for session_id, tenant_id in due:
        with tenant_scope(tenant_id), transaction.atomic():
            session = (ChatSession.objects.select_for_update().filter(pk=session_id, deleted_at__lt=cutoff)
                       .first())
            if session is None or Run.objects.filter(session=session, status__in=ACTIVE_RUN_STATUSES).exists():
                continue
            # The calls stay (usage), their model call records (the conversation itself) go with the chat.
            LLMCallBody.objects.filter(llm_call__run__session=session).delete()
            session.delete()
            purged.append(session_id)
    if purged:
        from agent_platform.redis_clients import sync_redis

        sync_redis().delete(*(key for session_id in purged for key in session_keys(session_id)))
    return len(purged)
