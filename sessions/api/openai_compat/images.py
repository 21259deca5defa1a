"""Image parts of the user's last message: ``image_url`` (chat completions) and ``input_image``
(the Responses API) with a ``data:`` URL.

Each image is stored as an artifact of the run's chat and referenced in the message, as the
chat app's attachments are (:func:`sessions.chat_services.run_images_attach`); the runner sends
it with the message to route entries that take images (``supports_images``), the others read
its reference line. Only ``data:`` URLs of the four types both model APIs take
(:data:`llm.types.IMAGE_MIME_TYPES`) up to the chat's image limit
(:func:`sessions.runner.images.image_max_bytes`) are accepted: the platform does not fetch
``http(s)`` URLs for a caller. Images in earlier messages of a conversation are refused (the
chat keeps images with the message the run answers).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

from llm.types import IMAGE_MIME_TYPES
from sessions.api.openai_compat.errors import OpenAIError, bad_request
from sessions.runner.images import MAX_IMAGES_PER_MESSAGE, image_max_bytes

IMAGES_ONLY_TEXT = "(see the attached image)"
"""The text of a message that has images and no text (a chat message is never empty)."""
DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+);base64,(?P<data>[A-Za-z0-9+/=\s]*)$")


@dataclass(frozen=True, slots=True)
class ImageInput:
    """An image of the request: its name (``image-<n>.<ext>``), type and bytes."""

    name: str
    mime_type: str
    data: bytes

    def as_tuple(self) -> tuple[str, str, bytes]:
        return self.name, self.mime_type, self.data


def image_of(url: Any, *, param: str, index: int) -> ImageInput:
    """The image of a ``data:`` URL.

    Raises:
        OpenAIError: 400 naming ``param``: not a ``data:`` URL (``unsupported_value``), not
            base64, a type outside PNG / JPEG / GIF / WebP, empty or over the size limit.
    """
    found = DATA_URL.match(url) if isinstance(url, str) else None
    if found is None:
        raise OpenAIError(400, "Only images given as `data:image/...;base64,` URLs are accepted (the platform does "
                               "not fetch URLs).", param=param, code="unsupported_value")
    mime = found.group("mime").lower()
    if mime not in IMAGE_MIME_TYPES:
        raise bad_request(f"Unsupported image type {mime!r}: PNG, JPEG, GIF or WebP.", param=param)
    try:
        data = base64.b64decode(re.sub(r"\s+", "", found.group("data")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request("The image is not valid base64.", param=param) from exc
    if not data or len(data) > image_max_bytes():
        raise bad_request(f"An image must hold 1 to {image_max_bytes()} bytes.", param=param)
    return ImageInput(name=f"image-{index + 1}.{mime.split('/')[1]}", mime_type=mime, data=data)


def images_check(images: list[ImageInput], *, param: str) -> list[ImageInput]:
    """At most :data:`~sessions.runner.images.MAX_IMAGES_PER_MESSAGE` images (400 naming ``param``)."""
    if len(images) > MAX_IMAGES_PER_MESSAGE:
        raise bad_request(f"At most {MAX_IMAGES_PER_MESSAGE} images in a message.", param=param)
    return images
