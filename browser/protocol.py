"""The ``/ws/browser/`` wire protocol, server side (the extension's twin is
``chrome_extension/protocol.js``). Defined once here; every frame is validated on receipt.

Version 1. Frames are JSON objects with a ``type``:

extension → server
    ``hello``   ``{protocol_versions: [1], extension_version, ops: [...]}``: first frame.
    ``result``  ``{id, ok: true, result: {...}}`` or ``{id, ok: false, error: {code, message}}``.
    ``ping`` / ``pong``  ``{ts?}``: keepalive (the extension pings every 20 s).
server → extension
    ``welcome`` ``{protocol, server_version, device: {id, name}, user, tenant, ping_seconds}``.
    ``command`` ``{id, op, params, deadline_ms, idempotency_key}``.
    ``ping`` / ``pong``; ``error`` ``{code, message}`` before a close.

Limits: a frame is at most :data:`MAX_FRAME_BYTES` (screenshots travel as base64 PNG).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

PROTOCOL_VERSION = 1
SUBPROTOCOL = "agent-platform.browser.v1"
"""Offered by the extension in ``Sec-WebSocket-Protocol`` together with ``token.<device token>``."""
TOKEN_SUBPROTOCOL_PREFIX = "token."
MAX_FRAME_BYTES = 8 * 1024 * 1024
OPS = ("tabs", "navigate", "snapshot", "click", "type", "select", "press", "scroll", "wait_for", "get_text",
       "screenshot")
"""Operations a command may name (one per browser tool)."""

Op = Literal["tabs", "navigate", "snapshot", "click", "type", "select", "press", "scroll", "wait_for", "get_text",
             "screenshot"]


class ProtocolError(ValueError):
    """A frame that is not valid protocol (bad JSON, unknown type, wrong shape, too big)."""


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hello(_Frame):
    type: Literal["hello"]
    protocol_versions: list[int] = Field(min_length=1, max_length=10)
    extension_version: str = Field(default="", max_length=32)
    ops: list[str] = Field(default_factory=list, max_length=50)


class ErrorBody(_Frame):
    code: str = Field(max_length=64)
    message: str = Field(max_length=4000)


class Result(_Frame):
    type: Literal["result"]
    id: str = Field(min_length=1, max_length=64)
    ok: bool
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Result:
        if self.ok and self.result is None:
            raise ValueError("ok results need 'result'")
        if not self.ok and self.error is None:
            raise ValueError("failed results need 'error'")
        return self


class Ping(_Frame):
    type: Literal["ping"]
    ts: float | None = None


class Pong(_Frame):
    type: Literal["pong"]
    ts: float | None = None


ExtensionFrame = Annotated[Hello | Result | Ping | Pong, Field(discriminator="type")]
_extension_frame: TypeAdapter[Any] = TypeAdapter(ExtensionFrame)


class Command(_Frame):
    type: Literal["command"] = "command"
    id: str = Field(min_length=1, max_length=64)
    op: Op
    params: dict[str, Any]
    deadline_ms: int = Field(ge=1, le=300_000)
    """Milliseconds the extension has, from receipt, before the server gives up."""
    idempotency_key: str = Field(min_length=1, max_length=128)
    """Same key → same effect: a replay returns the stored result instead of acting again."""


class Welcome(_Frame):
    type: Literal["welcome"] = "welcome"
    protocol: int = PROTOCOL_VERSION
    server_version: str
    device: dict[str, Any]
    user: str
    tenant: str
    ping_seconds: int = 20


def parse_extension_frame(text: str | bytes) -> Hello | Result | Ping | Pong:
    """Parse and validate one frame from the extension.

    Raises:
        ProtocolError: too big, not JSON, or not a valid frame (message says why).
    """
    if len(text) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(text)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    try:
        return _extension_frame.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(f"invalid frame: {exc.errors(include_url=False)[:3]}") from exc
