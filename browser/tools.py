"""The browser tools the model sees, and the one backend interface behind them.

Eleven tools (``browser_tabs``, ``browser_navigate``, ``browser_snapshot``, ``browser_click``,
``browser_type``, ``browser_select``, ``browser_press``, ``browser_scroll``, ``browser_wait_for``,
``browser_get_text``, ``browser_screenshot``), each one operation of a :class:`BrowserBackend`:

- :class:`ExtensionBackend`: the run user's own Chrome through the extension
  (:mod:`browser.bridge`);
- :class:`ServerBackend`: a headless Chromium on the server (:mod:`browser.server_backend`).

Both run the same page script (``chrome_extension/snapshot.js``) for snapshots and actions.
All tools are ``untrusted``: page text reaches the model framed as data by the runner.
Every action returns what changed: URL, title and a short diff of the page's element list.
"""

from __future__ import annotations

import abc
import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from browser.bridge import BrowserError, bridge_execute
from capabilities.tools import ApprovalRequired, Tool, ToolContext, ToolError, ToolResult
from llm.tokens import CHARS_PER_TOKEN, estimate_text_tokens
from llm.types import ToolSpec

ACTION_DEADLINE_MS = 10_000
NAVIGATION_DEADLINE_MS = 30_000
DEFAULT_SNAPSHOT_TOKENS = 2_000
MAX_SNAPSHOT_TOKENS = 20_000


@dataclass(frozen=True, slots=True)
class BrowserConfig:
    """A browser binding's ``config`` (validated in ``CapabilityBinding.clean``)."""

    backend: str = "extension"
    """``extension`` (the user's Chrome) or ``server`` (headless Chromium on the server)."""
    fallback_to_server: bool = False
    """With ``backend: extension``: use the server browser when no extension is connected."""
    allowed_origins: tuple[str, ...] = ()
    """Empty: every origin not blocked."""
    blocked_origins: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> BrowserConfig:
        return cls(
            backend=config.get("backend", "extension"),
            fallback_to_server=bool(config.get("fallback_to_server", False)),
            allowed_origins=tuple(config.get("allowed_origins", ())),
            blocked_origins=tuple(config.get("blocked_origins", ())),
        )


class BrowserBackend(abc.ABC):
    """Where browser operations run. One instance per run (per session for the server)."""

    name: str

    @abc.abstractmethod
    async def execute(self, op: str, params: dict[str, Any], *, deadline_ms: int, idempotency_key: str) -> dict[str, Any]:
        """Run ``op`` (one of :data:`browser.protocol.OPS`) with ``params``.

        ``params`` always carries ``session_id`` (tab group / browser context of the chat),
        ``policy`` ``{allowed_origins, blocked_origins}`` and ``approved`` (bool).

        Returns:
            The operation's result object (``url``, ``title`` and op-specific fields).

        Raises:
            BrowserError: with a code such as ``browser_not_connected``, ``stale_ref``,
                ``origin_blocked``, ``approval_required``, ``timeout``.
        """


class ExtensionBackend(BrowserBackend):
    name = "extension"

    def __init__(self, *, tenant_id: int, user_id: int) -> None:
        self.tenant_id = tenant_id
        self.user_id = user_id

    async def execute(self, op: str, params: dict[str, Any], *, deadline_ms: int, idempotency_key: str) -> dict[str, Any]:
        return await bridge_execute(tenant_id=self.tenant_id, user_id=self.user_id, op=op, params=params,
                                    deadline_ms=deadline_ms, idempotency_key=idempotency_key)


class ServerBackend(BrowserBackend):
    name = "server"

    def __init__(self, *, tenant_id: int, session_id: int) -> None:
        self.tenant_id = tenant_id
        self.session_id = session_id

    async def execute(self, op: str, params: dict[str, Any], *, deadline_ms: int, idempotency_key: str) -> dict[str, Any]:
        from browser.server_backend import server_browser_pool

        return await server_browser_pool().execute(
            key=f"t{self.tenant_id}.s{self.session_id}", op=op, params=params, deadline_ms=deadline_ms,
            idempotency_key=idempotency_key,
        )


@dataclass(slots=True)
class BrowserRun:
    """The browser state one run's tools share: the binding's config and the chosen backend."""

    config: BrowserConfig
    backend_override: BrowserBackend | None = None
    """Tests inject a backend here."""
    _fallback_used: bool = field(default=False)

    async def execute(self, op: str, params: dict[str, Any], *, context: ToolContext, deadline_ms: int) -> tuple[str, dict[str, Any]]:
        """Run ``op`` on the configured backend (falling back to the server when allowed).

        Returns:
            ``(backend name, result)``.
        """
        params = dict(params, session_id=context.session_id, approved=bool(context.approved), policy={
            "allowed_origins": list(self.config.allowed_origins), "blocked_origins": list(self.config.blocked_origins),
        })
        key = f"r{context.run_id}.c{context.tool_call_id}.{op}"
        if self.backend_override is not None:
            backend = self.backend_override
        elif self.config.backend == "server" or self._fallback_used:
            backend = ServerBackend(tenant_id=context.tenant_id, session_id=context.session_id)
        else:
            backend = ExtensionBackend(tenant_id=context.tenant_id, user_id=context.user_id or 0)
        try:
            return backend.name, await backend.execute(op, params, deadline_ms=deadline_ms, idempotency_key=key)
        except BrowserError as exc:
            if exc.code == "browser_not_connected" and backend.name == "extension" and self.config.fallback_to_server:
                self._fallback_used = True
                server = ServerBackend(tenant_id=context.tenant_id, session_id=context.session_id)
                return server.name, await server.execute(op, params, deadline_ms=deadline_ms, idempotency_key=key)
            raise


def _ref(value: Any, *, allow_page: bool = False) -> str:
    if allow_page and (value is None or value == "page"):
        return "page"
    if not isinstance(value, str) or not value.strip():
        raise ToolError("Give a 'ref' from the latest browser_snapshot, like \"e12\".", code="invalid_arguments")
    return value.strip().removeprefix("ref=")


def _diff_text(result: dict[str, Any]) -> str:
    if result.get("navigating") or result.get("navigated"):
        return "The page navigated; take a browser_snapshot to see it."
    diff = result.get("diff")
    if not diff:
        return ""
    if not diff["added_count"] and not diff["removed_count"]:
        return "No change in the page's interactive elements."
    lines = [f"Changes: +{diff['added_count']} / -{diff['removed_count']} elements"]
    lines += [f"+ {line}" for line in diff["added"]]
    if diff["added_count"] > len(diff["added"]):
        lines.append(f"+ … {diff['added_count'] - len(diff['added'])} more")
    lines += [f"- {line}" for line in diff["removed"]]
    if diff["removed_count"] > len(diff["removed"]):
        lines.append(f"- … {diff['removed_count'] - len(diff['removed'])} more")
    return "\n".join(lines)


class BrowserTool(Tool):
    """One browser operation as a tool. Subclasses set ``op``, ``spec`` and ``deadline_ms``."""

    op: str
    deadline_ms: int = ACTION_DEADLINE_MS
    untrusted = True

    def __init__(self, run: BrowserRun) -> None:
        self.run = run

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The command's params from the model's arguments (raise ToolError for bad input)."""
        return {}

    def deadline_for(self, params: dict[str, Any]) -> int:
        """Milliseconds the backend has for this call (actions 10 s, navigation 30 s)."""
        return self.deadline_ms

    def render(self, result: dict[str, Any]) -> str:
        """The text the model reads."""
        parts = [f"URL: {result.get('url', '')}", f"Title: {result.get('title', '')}"]
        diff = _diff_text(result)
        if diff:
            parts.append(diff)
        return "\n".join(parts)

    def summary(self, params: dict[str, Any]) -> dict[str, Any]:
        """Params as shown in ``browser_operation`` events (no typed text: it may be secret)."""
        return {k: v for k, v in params.items() if k not in ("text",)}

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        params = self.params(arguments)
        shown = self.summary(params)
        await self._publish(context, params=shown, status="started", url="")
        try:
            backend, result = await self.run.execute(self.op, params, context=context,
                                                     deadline_ms=self.deadline_for(params))
        except BrowserError as exc:
            if exc.code == "approval_required" and not context.approved:
                await self._publish(context, params=shown, status="awaiting_approval", url="", error_code=exc.code)
                raise ApprovalRequired(exc.message) from exc
            await self._publish(context, params=shown, status="failed", url="", error_code=exc.code)
            raise ToolError(exc.message, code=exc.code) from exc
        data = await self.finish(result, context)
        await self._publish(context, params=shown, status="succeeded", url=result.get("url", ""), backend=backend)
        return ToolResult(content=self.render(result), data=data)

    async def finish(self, result: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        """Post-process a result (store artifacts...); returns the call's structured data."""
        return {k: v for k, v in result.items() if k not in ("text",)}

    async def _publish(self, context: ToolContext, *, params: dict[str, Any], status: str, url: str,
                       error_code: str = "", backend: str = "") -> None:
        if context.publish is None:
            return
        data = {"tool_call_id": context.tool_call_id, "op": self.op, "params": params, "status": status, "url": url}
        if error_code:
            data["error_code"] = error_code
        if backend:
            data["backend"] = backend
        await context.publish("browser_operation", data)


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str] | None = None) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters={
        "type": "object", "properties": properties, "required": required or [], "additionalProperties": False,
    })


REF = {"type": "string", "description": 'An element ref from the latest browser_snapshot, e.g. "e12".'}


class BrowserTabs(BrowserTool):
    op = "tabs"
    spec = _spec("browser_tabs", (
        "List, open, select or close the browser tabs of this chat. Only tabs the agent opened (or the user "
        "handed over) are visible. Returns the tab list with ids; the selected tab is where other browser tools act."
    ), {
        "action": {"type": "string", "enum": ["list", "new", "select", "close"]},
        "url": {"type": "string", "description": "For action=new: the page to open (default about:blank)."},
        "tab_id": {"type": "integer", "description": "For select/close: a tab id from the list."},
    }, ["action"])

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        action = arguments.get("action", "list")
        if action not in ("list", "new", "select", "close"):
            raise ToolError("'action' must be one of list, new, select, close.", code="invalid_arguments")
        params: dict[str, Any] = {"action": action}
        if action == "new":
            params["url"] = str(arguments.get("url") or "about:blank")
        if action in ("select", "close"):
            if not isinstance(arguments.get("tab_id"), int):
                raise ToolError(f"action={action} needs 'tab_id' (an integer from browser_tabs list).",
                                code="invalid_arguments")
            params["tab_id"] = arguments["tab_id"]
        return params

    def render(self, result: dict[str, Any]) -> str:
        tabs = result.get("tabs", [])
        if not tabs:
            return "No tabs open for this chat. Use browser_tabs with action=new or browser_navigate."
        return "\n".join(
            f"{'*' if t.get('selected') else ' '} tab {t['id']}: {t.get('title') or '(untitled)'} — {t.get('url')}"
            for t in tabs
        )


class BrowserNavigate(BrowserTool):
    op = "navigate"
    deadline_ms = NAVIGATION_DEADLINE_MS
    spec = _spec("browser_navigate", (
        "Open a URL in the selected tab (opens a tab for this chat if there is none) and wait for the page to load. "
        "Returns the final URL and title (after redirects). Then call browser_snapshot to see the page."
    ), {"url": {"type": "string", "description": "Absolute http(s) URL."}}, ["url"])

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        url = arguments.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ToolError("'url' must be an absolute http:// or https:// URL.", code="invalid_arguments")
        return {"url": url}

    def render(self, result: dict[str, Any]) -> str:
        return f"URL: {result.get('url', '')}\nTitle: {result.get('title', '')}\nLoaded. Call browser_snapshot to see it."


class BrowserSnapshot(BrowserTool):
    op = "snapshot"
    spec = _spec("browser_snapshot", (
        "List the selected tab's interactive and landmark elements, each with a ref like [ref=e12], visible ones "
        "first. Use the refs with browser_click, browser_type, browser_select, browser_scroll and browser_get_text. "
        "Refs from an older snapshot may go stale when the page changes."
    ), {"max_tokens": {"type": "integer", "description": f"Budget for the listing (default {DEFAULT_SNAPSHOT_TOKENS})."}})

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        tokens = arguments.get("max_tokens", DEFAULT_SNAPSHOT_TOKENS)
        if not isinstance(tokens, int) or tokens < 100:
            raise ToolError("'max_tokens' must be an integer ≥ 100.", code="invalid_arguments")
        tokens = min(tokens, MAX_SNAPSHOT_TOKENS)
        return {"max_tokens": tokens, "max_chars": int(tokens * CHARS_PER_TOKEN)}

    def render(self, result: dict[str, Any]) -> str:
        return f"URL: {result.get('url', '')}\nTitle: {result.get('title', '')}\n{result.get('text', '')}"

    async def finish(self, result: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        data = await super().finish(result, context)
        data["tokens"] = estimate_text_tokens(result.get("text", ""))
        return data


class BrowserClick(BrowserTool):
    op = "click"
    spec = _spec("browser_click", "Click the element with this ref (from browser_snapshot).", {"ref": REF}, ["ref"])

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"ref": _ref(arguments.get("ref"))}


class BrowserType(BrowserTool):
    op = "type"
    spec = _spec("browser_type", (
        "Replace the text of the field with this ref; with submit=true, press Enter / submit its form afterwards. "
        "Typing into password fields needs the user's approval."
    ), {
        "ref": REF, "text": {"type": "string"},
        "submit": {"type": "boolean", "description": "Submit after typing (default false)."},
    }, ["ref", "text"])

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        text = arguments.get("text")
        if not isinstance(text, str):
            raise ToolError("'text' must be a string.", code="invalid_arguments")
        return {"ref": _ref(arguments.get("ref")), "text": text, "submit": bool(arguments.get("submit", False))}

    def summary(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ref": params["ref"], "submit": params["submit"], "text_chars": len(params["text"])}


class BrowserSelect(BrowserTool):
    op = "select"
    spec = _spec("browser_select", "Choose option(s) of the select box with this ref, by value or label.", {
        "ref": REF, "values": {"type": "array", "items": {"type": "string"}},
    }, ["ref", "values"])

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        values = arguments.get("values")
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise ToolError("'values' must be a non-empty list of option values or labels.", code="invalid_arguments")
        return {"ref": _ref(arguments.get("ref")), "values": values}


class BrowserPress(BrowserTool):
    op = "press"
    spec = _spec("browser_press", (
        "Press keys in the focused element, e.g. \"Enter\", \"Tab\", \"Escape\", \"ArrowDown\"; several separated by spaces."
    ), {"keys": {"type": "string"}}, ["keys"])

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        keys = arguments.get("keys")
        if not isinstance(keys, str) or not keys.strip() or len(keys) > 200:
            raise ToolError("'keys' must be key names separated by spaces, e.g. \"Enter\".", code="invalid_arguments")
        return {"keys": keys}


class BrowserScroll(BrowserTool):
    op = "scroll"
    spec = _spec("browser_scroll", "Scroll the page (ref=\"page\", default) by a screen, or scroll an element into view.", {
        "ref": {"type": "string", "description": 'An element ref, or "page".'},
        "direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
    })

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        direction = arguments.get("direction", "down")
        if direction not in ("up", "down", "left", "right"):
            raise ToolError("'direction' must be up, down, left or right.", code="invalid_arguments")
        return {"ref": _ref(arguments.get("ref"), allow_page=True), "direction": direction}


class BrowserWaitFor(BrowserTool):
    op = "wait_for"
    spec = _spec("browser_wait_for", (
        "Wait until a text appears (text), disappears (text_gone), or a number of seconds passed (at most 10)."
    ), {
        "text": {"type": "string"}, "text_gone": {"type": "string"},
        "seconds": {"type": "number", "description": "Plain wait, 0-10 s."},
        "timeout_seconds": {"type": "number", "description": "For text/text_gone: give up after this (default 5, max 25)."},
    })

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        text, gone, seconds = arguments.get("text"), arguments.get("text_gone"), arguments.get("seconds")
        if not text and not gone and seconds is None:
            raise ToolError("Give 'text', 'text_gone' or 'seconds'.", code="invalid_arguments")
        if seconds is not None and (not isinstance(seconds, (int, float)) or not 0 <= seconds <= 10):
            raise ToolError("'seconds' must be between 0 and 10.", code="invalid_arguments")
        timeout = arguments.get("timeout_seconds", 5)
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 25:
            raise ToolError("'timeout_seconds' must be between 0 and 25.", code="invalid_arguments")
        params: dict[str, Any] = {"timeout_ms": int((seconds if seconds is not None and not text and not gone else timeout) * 1000)}
        if text:
            params["text"] = str(text)
        if gone:
            params["text_gone"] = str(gone)
        if seconds is not None:
            params["seconds"] = seconds
        return params

    def deadline_for(self, params: dict[str, Any]) -> int:
        return params["timeout_ms"] + 5_000

    def summary(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(params)  # the awaited text is not a secret


class BrowserGetText(BrowserTool):
    op = "get_text"
    spec = _spec("browser_get_text", "Read the visible text of an element (ref) or of the whole page (ref=\"page\").", {
        "ref": {"type": "string", "description": 'An element ref, or "page" (default).'},
        "max_chars": {"type": "integer", "description": "Cut after this many characters (default 4000)."},
    })

    def params(self, arguments: dict[str, Any]) -> dict[str, Any]:
        max_chars = arguments.get("max_chars", 4000)
        if not isinstance(max_chars, int) or not 1 <= max_chars <= 100_000:
            raise ToolError("'max_chars' must be an integer from 1 to 100000.", code="invalid_arguments")
        return {"ref": _ref(arguments.get("ref"), allow_page=True), "max_chars": max_chars}

    def render(self, result: dict[str, Any]) -> str:
        more = f"\n[… cut at {len(result.get('text', ''))} of {result.get('total_chars')} characters]" if result.get("truncated") else ""
        return f"URL: {result.get('url', '')}\nTitle: {result.get('title', '')}\n{result.get('text', '')}{more}"


class BrowserScreenshot(BrowserTool):
    op = "screenshot"
    spec = _spec("browser_screenshot", "Take a PNG screenshot of the selected tab's visible part; stored as an artifact.", {})

    async def finish(self, result: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        try:
            png = base64.b64decode(result.pop("png_base64", ""), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ToolError("The browser returned an unreadable screenshot.", code="browser_error") from exc
        result["artifact_id"] = await context.artifact_save(name="screenshot.png", mime_type="image/png", data=png)
        result["size_bytes"] = len(png)
        return result

    def render(self, result: dict[str, Any]) -> str:
        return (f"URL: {result.get('url', '')}\nTitle: {result.get('title', '')}\n"
                f"Screenshot saved as artifact {result.get('artifact_id')} ({result.get('size_bytes')} bytes, PNG).")


TOOL_CLASSES: tuple[type[BrowserTool], ...] = (
    BrowserTabs, BrowserNavigate, BrowserSnapshot, BrowserClick, BrowserType, BrowserSelect, BrowserPress,
    BrowserScroll, BrowserWaitFor, BrowserGetText, BrowserScreenshot,
)
"""Every browser tool, in the order they are offered."""


def browser_tools(run: BrowserRun) -> list[BrowserTool]:
    """Fresh tool instances sharing ``run`` (one set per run and binding)."""
    return [cls(run) for cls in TOOL_CLASSES]
