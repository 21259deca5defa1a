"""Images of the user's messages, for route entries that take image input.

A file attached in the chat is stored as an artifact of the session, and the message carries
a reference line for it (:func:`sessions.chat_services.attachment_reference`):
``[image: artifact:12 "cat.png", image/png, 81.0 kB]``. Before each model turn,
:func:`history_with_images` gives every user message of the history whose text has such lines
the images themselves (:attr:`llm.types.ChatMessage.images`), when an entry of the run's route
``supports_images``. The text keeps its reference lines, so an entry without image input (a
fallback included: the router switches entries only before the first streamed token) gets the
text alone; the adapters decide per entry (:mod:`llm.providers`).

An image is attached only when it is an artifact **of the run's session** (a reference typed
by hand to another chat's artifact stays text), of a type both APIs take
(:data:`llm.types.IMAGE_MIME_TYPES`) and at most :func:`image_max_bytes` large; otherwise its
reference line gets a note saying why the model does not see it.

Artifacts never change once stored, so their base64 form is kept in a small per-process cache
(:data:`CACHE_MAX_CHARS` of base64 in all, least recently used first out): a run's turns, and
the next runs of the chat, do not read and encode the same bytes again. The artifacts are read
through the run's store (:meth:`sessions.runner.ports.RunStore.images_load`; production: one
statement on the loop's connection, :func:`sessions.runner.database.images_load`).
"""

from __future__ import annotations

import base64
import dataclasses
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from llm.types import IMAGE_MIME_TYPES, ChatMessage, ImagePart

if TYPE_CHECKING:
    from sessions.runner.database import History
    from sessions.runner.ports import ArtifactImage, RunStore

IMAGE_REFERENCE = re.compile(r'^\[image: artifact:(\d+) "[^\n]*\]$', re.MULTILINE)
"""A reference line of an image attachment (group 1: the artifact id)."""

MAX_IMAGES_PER_MESSAGE = 10
"""At most this many images go with one message (the chat app attaches at most 10 files)."""

CACHE_MAX_CHARS = 64 * 1024 * 1024
"""Base64 characters the per-process cache holds at most (64 MiB: ~17 images at the default
size limit)."""


def image_max_bytes() -> int:
    """``settings.CHAT_IMAGE_MAX_BYTES``: the largest image sent to a model, bytes. Default
    3,932,160 (3.75 MiB): its base64 form is 5,242,880 characters, the 5 MiB per-image limit
    the Anthropic Messages API enforces on the base64 text ("image exceeds 5 MB maximum");
    OpenAI's is larger."""
    from django.conf import settings

    return int(getattr(settings, "CHAT_IMAGE_MAX_BYTES", 5 * 1024 * 1024 * 3 // 4))


@dataclasses.dataclass(frozen=True, slots=True)
class _Found:
    """What became of one referenced artifact: its image, or why there is none."""

    image: ImagePart | None
    note: str = ""
    """Appended to the reference line when ``image`` is None ("" if the artifact is not found)."""


class _Cache:
    """``(tenant_id, session_id, artifact_id, size limit) → _Found``, least recently used dropped first
    once the images in it pass :data:`CACHE_MAX_CHARS`. Thread-safe."""

    def __init__(self, max_chars: int) -> None:
        self._max = max_chars
        self._items: OrderedDict[tuple[int, int, int, int], _Found] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int, int, int]) -> _Found | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[int, int, int, int], found: _Found) -> None:
        size = len(found.image.data) if found.image else 0
        if size > self._max:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None and old.image is not None:
                self._chars -= len(old.image.data)
            self._items[key] = found
            self._chars += size
            while self._chars > self._max and self._items:
                _, dropped = self._items.popitem(last=False)
                if dropped.image is not None:
                    self._chars -= len(dropped.image.data)


_cache = _Cache(CACHE_MAX_CHARS)


def _human_bytes(size: int) -> str:
    """As the reference lines write sizes: ``512 B``, ``81.0 kB``, ``3.9 MB``."""
    return f"{size} B" if size < 1000 else f"{size / 1000:.1f} kB" if size < 1_000_000 else f"{size / 1e6:.1f} MB"


def _found(image: ArtifactImage, limit: int) -> _Found:
    """What the model gets of ``image`` (a row of the store's ``images_load``)."""
    if image.mime_type not in IMAGE_MIME_TYPES:
        return _Found(None, f"(not shown to you: {image.mime_type} is not an image type models take; "
                            "PNG, JPEG, GIF and WebP are)")
    if image.size_bytes > limit:
        return _Found(None, f"(not shown to you: larger than the {_human_bytes(limit)} limit for images; "
                            "ask for a smaller one if you need to see it)")
    if not image.content:
        return _Found(None, "(not shown to you: the file is empty)")
    return _Found(ImagePart(mime_type=image.mime_type, data=base64.b64encode(image.content).decode("ascii")))


def _with_images(message: ChatMessage, found: dict[int, _Found]) -> ChatMessage:
    """``message`` with the images of its reference lines, and notes on those not sent."""
    images: list[ImagePart] = []

    def line(match: re.Match[str]) -> str:
        item = found.get(int(match.group(1)))
        if item is None:
            return match.group(0)
        if item.image is None:
            return f"{match.group(0)} {item.note}" if item.note else match.group(0)
        if len(images) >= MAX_IMAGES_PER_MESSAGE:
            return f"{match.group(0)} (not shown to you: at most {MAX_IMAGES_PER_MESSAGE} images per message)"
        images.append(item.image)
        return match.group(0)

    content = IMAGE_REFERENCE.sub(line, message.content)
    if not images and content == message.content:
        return message
    return dataclasses.replace(message, content=content, images=tuple(images))


async def history_with_images(history: History, *, store: RunStore, tenant_id: int, session_id: int,
                              supports_images: bool) -> History:
    """``history`` with the images of its user messages attached (see the module docstring).

    Args:
        history: The turn's history; returned as is when no user message references an image.
        store: The run's store: the images not cached are read through it (``images_load``).
        tenant_id: The run's tenant (the current tenant scope), a cache key.
        session_id: The run's session: only its artifacts are attached.
        supports_images: Whether some entry of the run's route takes image input; False
            returns ``history`` unchanged (no query, no parsing beyond this check).

    Returns:
        A history whose ``messages`` carry ``images`` (one ``images_load`` of the store for the
        images not cached).

    Requires tenant scope.
    """
    if not supports_images:
        return history
    wanted = {int(m.group(1)) for message in history.messages if _references_images(message)
              for m in IMAGE_REFERENCE.finditer(message.content)}
    if not wanted:
        return history
    found = await _images_found(store, tenant_id=tenant_id, session_id=session_id, wanted=wanted)
    messages = [_with_images(m, found) if _references_images(m) else m for m in history.messages]
    return dataclasses.replace(history, messages=messages)


def _references_images(message: ChatMessage) -> bool:
    """Whether ``message`` is a user message that may hold image reference lines."""
    return message.role == "user" and "[image: artifact:" in message.content


async def _images_found(store: RunStore, *, tenant_id: int, session_id: int, wanted: set[int]) -> dict[int, _Found]:
    """``{artifact id: _Found}`` for ``wanted``: from the cache, the others read through ``store``
    (then cached). An id the store does not find (another chat's) is left out."""
    limit = image_max_bytes()
    found: dict[int, _Found] = {}
    missing = []
    for artifact_id in wanted:
        cached = _cache.get((tenant_id, session_id, artifact_id, limit))
        if cached is None:
            missing.append(artifact_id)
        else:
            found[artifact_id] = cached
    if missing:
        rows = await store.images_load(session_id=session_id, artifact_ids=sorted(missing), max_bytes=limit)
        for row in rows:
            item = _found(row, limit)
            _cache.put((tenant_id, session_id, row.artifact_id, limit), item)
            found[row.artifact_id] = item
    return found
