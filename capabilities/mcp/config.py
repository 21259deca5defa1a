"""How to reach one MCP server: :class:`McpServerConfig` (validated on construction), and the
timeout rule every MCP bound follows (:func:`check_timeout_seconds`).

No Django imports: the runner, the pool, the console's Test connection and tests build it
(:mod:`capabilities.services` from a tenant's ``McpServer`` row and its program template).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from capabilities.confinement import SandboxProfile

_ALIAS_RE = re.compile(r"^[a-z0-9_-]{1,64}$")


def check_timeout_seconds(value: float, *, what: str) -> None:
    """Validate a timeout (house rule: positive finite seconds).

    Args:
        value: The timeout, in seconds.
        what: Its name, for the message.

    Raises:
        ValueError: ``value`` is not a positive finite int/float (bools rejected).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive finite number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """How to reach one MCP server. Validated on construction (``ValueError``)."""

    alias: str
    """Short name used in exposed tool names and messages: ``[a-z0-9_-]``, 1-64 chars."""
    transport: Literal["stdio", "sse", "streamable_http"]
    """``stdio`` (spawn a local process), ``sse`` (legacy HTTP+SSE, protocol 2024-11-05) or
    ``streamable_http``. Both protocol eras (the ``initialize`` handshake and 2026-07-28
    ``server/discover``) are negotiated automatically (the SDK's ``mode="auto"``)."""
    command: str = ""
    """stdio: the executable to spawn (absolute path or looked up on the child's PATH)."""
    args: tuple[str, ...] = ()
    """stdio: its arguments."""
    url: str = ""
    """sse / streamable_http: the MCP endpoint (the SSE stream URL for ``sse``), ``http://`` or
    ``https://``."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """sse / streamable_http: sent with every request (e.g. ``Authorization``). Not shown in ``repr``."""
    connect_timeout_seconds: float = 30.0
    """Bound on spawn/TCP connect plus the MCP handshake; also the HTTP connect timeout."""
    list_timeout_seconds: float = 30.0
    """Bound on one whole ``list_tools`` (all pages together)."""
    call_timeout_seconds: float = 60.0
    """Bound on one tool call (the run's per-tool timeout may be shorter and then wins)."""
    protocol_mode: Literal["auto", "legacy"] = "auto"
    """``auto``: probe ``server/discover`` (2026-07-28) and fall back to the ``initialize``
    handshake; ``legacy``: the handshake only (for servers that mishandle the probe)."""
    sandbox: SandboxProfile | None = None
    """stdio (required): the confinement the process is started in
    (:mod:`capabilities.confinement`); its ``env`` is the server's whole environment on top of
    PATH/HOME/LANG (the template's variables and the tenant's secrets). There is no way to
    start a stdio server unconfined. None for sse / streamable_http."""
    auth_key: str = ""
    """sse / streamable_http with OAuth: which connection's tokens ``auth`` sends (e.g.
    ``oauth:17``); part of the fingerprint, so two people's connections never share a session."""
    auth: Any = field(default=None, repr=False, compare=False)
    """sse / streamable_http: an ``httpx2.Auth`` for every request (OAuth bearer tokens,
    :mod:`capabilities.mcp_oauth`); not part of the fingerprint (``auth_key`` is)."""

    def __post_init__(self) -> None:
        if not _ALIAS_RE.match(self.alias):
            raise ValueError(f"alias must match [a-z0-9_-]{{1,64}}, got {self.alias!r}")
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"MCP server {self.alias!r}: a stdio server needs a command")
            if self.sandbox is None:
                raise ValueError(f"MCP server {self.alias!r}: a stdio server runs confined: it needs a sandbox profile")
        elif self.transport in ("sse", "streamable_http"):
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(
                    f"MCP server {self.alias!r}: url must start with http:// or https://, got {self.url!r}"
                )
        else:
            raise ValueError(f"MCP server {self.alias!r}: unknown transport {self.transport!r}")
        if self.protocol_mode not in ("auto", "legacy"):
            raise ValueError(f"MCP server {self.alias!r}: protocol_mode must be 'auto' or 'legacy'")
        check_timeout_seconds(self.connect_timeout_seconds, what="connect_timeout_seconds")
        check_timeout_seconds(self.list_timeout_seconds, what="list_timeout_seconds")
        check_timeout_seconds(self.call_timeout_seconds, what="call_timeout_seconds")
        # Read-only copies, so a caller mutating its dict cannot change a live config.
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    def _identity(self) -> tuple[Any, ...]:
        return (
            self.alias,
            self.transport,
            self.command,
            self.args,
            self.url,
            tuple(sorted(self.headers.items())),
            self.connect_timeout_seconds,
            self.list_timeout_seconds,
            self.call_timeout_seconds,
            self.protocol_mode,
            self.auth_key,
            None if self.sandbox is None else (
                self.sandbox.network, self.sandbox.ro_binds, tuple(sorted(self.sandbox.env.items())),
                self.sandbox.uid, self.sandbox.gid, self.sandbox.bwrap_path, self.sandbox.bridge_python,
                self.sandbox.egress_socket, dataclasses.astuple(self.sandbox.limits),
            ),
        )

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def fingerprint(self) -> str:
        """SHA-256 hex of every field (secrets included, but only as a hash).

        The pool keys sessions on it, so an edited server (new command, URL, env, headers,
        timeouts or sandbox limits) gets a new session instead of reusing the old one.
        """
        return hashlib.sha256(json.dumps(self._identity(), default=list).encode()).hexdigest()

    @property
    def endpoint(self) -> str:
        """Where the server is, for messages that may reach the model or logs.

        The URL without credentials, query or fragment (they may carry tokens), or the stdio
        command without its arguments (same reason). Never the environment or headers.
        """
        if self.transport != "stdio":
            parts = urllib.parse.urlsplit(self.url)
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            port = f":{parts.port}" if parts.port is not None else ""
            return f"{parts.scheme}://{host}{port}{parts.path}"
        return self.command
