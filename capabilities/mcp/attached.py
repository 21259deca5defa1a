"""Resources a person attached to their message, or pinned to the chat, read when the run starts.

A chat message may carry resources of the agent's bound MCP servers (``POST
.../messages/`` with ``resources: [{binding | server, uri}]``, checked there); the run keeps them
as ``[{binding, server_id, server, uri}]`` (``Run.request_options.resources``, read by the
runner as :attr:`capabilities.registry.RunInfo.attached_resources`). At the run's first start
the ``mcp_server`` kind reads each one through the run's own pooled session of that server
(the one its tools use, leased by ``open_toolset``: the same connection, OAuth connection
included) and gives it to the model (:func:`attached_resource_blocks`):

- text contents: one start-context block per resource (:class:`~capabilities.registry.ContextBlock`,
  ``untrusted``: framed as outside data in the system message), titled with its URI and server;
- an image (PNG, JPEG, GIF, WebP) up to the run's image limit: attached to the user's message as
  the chat app's image attachments are (``OpenContext.attach_file``: an artifact of the chat and
  a reference line, so route entries that take images get the image itself), the block saying so;
- other binary contents: the block names them (type and size), which the model cannot read;
- a resource that cannot be read (an unknown URI, a server left out of the run, one too large):
  the block says why, so the model can tell the person.

A resource **pinned** to the chat (``sessions.PinnedResource``) comes the same way, marked
``pinned`` (``message_post`` adds the chat's pins to every run it creates), and is read with
:meth:`~capabilities.mcp.resources.ResourceCache.read_kept`: the session subscribes to the
pinned URIs first (all of a server's at once) when the server supports it, and a pin whose
kept contents are still fresh is not asked of the server again. Its block says it is pinned,
and its data whether the contents were kept (``kept``) and whether the server said the resource
changed since they were read (``updated``: the chat app's pinned chip says so).

The blocks are stored with the run (``Run.context``): a resumed run does not read them again.
No Django imports.
"""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import Sequence
from typing import Any

from capabilities.mcp.resources import DEFAULT_RESOURCE_MAX_BYTES, ResourceContent
from capabilities.registry import ContextBlock, OpenContext
from capabilities.tools import ToolError
from llm.types import IMAGE_MIME_TYPES

logger = logging.getLogger(__name__)

KIND_KEY = "mcp_server"
"""The kind's key: its per-run state in ``OpenContext.extra``."""


def attached_resources_of(run: Any) -> tuple[dict[str, Any], ...]:
    """The resources attached to ``run``'s message or pinned to its chat (``[{binding,
    server_id, server, uri, pinned?}]``); () for a run without (or a RunInfo that does not say)."""
    return tuple(getattr(run, "attached_resources", ()) or ())


def resource_max_bytes() -> int:
    """``settings.MCP_RESOURCE_MAX_BYTES`` (default 4 MiB): the most one read resource may hold."""
    try:
        from django.conf import settings

        return int(getattr(settings, "MCP_RESOURCE_MAX_BYTES", DEFAULT_RESOURCE_MAX_BYTES))
    except Exception:  # noqa: BLE001 - Django not configured: the default
        return DEFAULT_RESOURCE_MAX_BYTES


def _title(ref: dict[str, Any]) -> str:
    how = "pinned to the chat by the user" if ref.get("pinned") else "attached by the user to their message"
    return f"Resource {ref.get('uri')!r} of MCP server {ref.get('server')!r}, {how}:"


def _file_name(content: ResourceContent) -> str:
    """A file name for an attached image: the URI's last segment, with an extension of its type."""
    name = content.uri.rstrip("/").rsplit("/", 1)[-1] or "resource"
    extension = mimetypes.guess_extension(content.mime_type) or ""
    return name if "." in name or not extension else f"{name}{extension}"


async def _content_text(content: ResourceContent, ctx: OpenContext) -> tuple[str, str]:
    """``(text for the model, how it was given)`` for one read content."""
    if content.text is not None:
        return content.text, "text"
    data = content.data or b""
    if data and content.mime_type in IMAGE_MIME_TYPES and ctx.attach_file is not None:
        try:
            line = await ctx.attach_file(_file_name(content), content.mime_type, data)
        except Exception as exc:  # noqa: BLE001 - the model is told; the run goes on
            logger.warning("run %s: attached image %r not stored: %s", ctx.run_id, content.uri, exc)
            return f"(an image, {content.mime_type}, {len(data):,} bytes, that could not be attached: {exc})", "binary"
        return f"(an image, {content.mime_type}, {len(data):,} bytes: attached to the user's message as {line})", "image"
    return f"(binary contents, {content.mime_type}, {len(data):,} bytes: not readable as text)", "binary"


async def _block(ref: dict[str, Any], opened: dict[int, Any], ctx: OpenContext, max_bytes: int) -> ContextBlock:
    """The start-context block of one attached resource (see the module docstring)."""
    data: dict[str, Any] = {"resource": {"server": ref.get("server"), "uri": ref.get("uri")}}
    pinned = bool(ref.get("pinned"))
    if pinned:
        data["resource"]["pinned"] = True
    session = opened.get(int(ref.get("server_id") or 0))
    if session is None:
        text = "It could not be read: the server is not available to this run (see the run's notices)."
        data["resource"]["error"] = "unavailable"
        return ContextBlock(source=KIND_KEY, title=_title(ref), text=text, data=data, untrusted=True)
    try:
        if pinned:
            if session.resources.announced_updated(str(ref["uri"])):
                data["resource"]["updated"] = True  # changed since the last run read it
            contents, data["resource"]["kept"] = await session.resources.read_kept(str(ref["uri"]), max_bytes=max_bytes)
        else:
            contents = await session.resources.read(str(ref["uri"]), max_bytes=max_bytes)
    except ToolError as exc:
        logger.info("run %s: attached resource %r not read: %s", ctx.run_id, ref.get("uri"), exc.message)
        data["resource"]["error"] = exc.code
        return ContextBlock(source=KIND_KEY, title=_title(ref), text=f"It could not be read: {exc.message}",
                            data=data, untrusted=True)
    parts, given = [], []
    for content in contents:
        text, how = await _content_text(content, ctx)
        parts.append(text if len(contents) == 1 else f"[{content.uri} {content.mime_type}]\n{text}")
        given.append({"uri": content.uri, "mime_type": content.mime_type, "size": content.size_bytes, "as": how})
    data["resource"]["contents"] = given
    return ContextBlock(source=KIND_KEY, title=_title(ref), text="\n\n".join(parts), data=data, untrusted=True)


async def attached_resource_blocks(ctx: OpenContext) -> list[ContextBlock]:
    """One block per resource attached to the run's message, read through the run's sessions
    (``ctx.extra["mcp_server"]``: ``{server id: pooled session}``, set by ``open_toolset``).

    Returns:
        The blocks, in the attachments' order (a failed read is a block saying why).
    """
    opened: dict[int, Any] = ctx.extra.get(KIND_KEY) or {}
    max_bytes = resource_max_bytes()
    refs = attached_resources_of(ctx.run)
    await _subscribe_pinned(refs, opened)
    return [await _block(ref, opened, ctx, max_bytes) for ref in refs]


async def _subscribe_pinned(refs: Sequence[dict[str, Any]], opened: dict[int, Any]) -> None:
    """Each opened server's pinned URIs subscribed to at once (``ResourceCache.keep``), before
    they are read; failures are the reads' to report."""
    pinned: dict[int, list[str]] = {}
    for ref in refs:
        server_id = int(ref.get("server_id") or 0)
        if ref.get("pinned") and server_id in opened:
            pinned.setdefault(server_id, []).append(str(ref["uri"]))
    for server_id, uris in pinned.items():
        await opened[server_id].resources.keep(uris)


def sessions_by_server(specs: Sequence[Any], sessions: Sequence[Any]) -> dict[int, Any]:
    """``{server id: session}`` of the run's opened servers (what :func:`attached_resource_blocks` reads through)."""
    return {spec.server_id: session for spec, session in zip(specs, sessions, strict=True)}
