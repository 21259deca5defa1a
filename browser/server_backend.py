"""The server-side browser: Playwright's async API driving the system Chromium.

One Chromium process per event loop (a Celery worker process hosts every run on one loop:
``sessions.runner.host``); one isolated browser context per chat session, closed when the
session has been idle for ``settings.BROWSER_SERVER_IDLE_SECONDS`` (default 600 s). The same
page script as the extension (``chrome_extension/snapshot.js``) is added to every document of
the context, so snapshots and refs behave the same on both backends.

Origins are checked here (the extension checks them in the user's browser): before acting on a
page, before navigating, and on the final URL after redirects.

Never downloads a browser through Playwright's installer: ``settings.BROWSER_CHROMIUM_PATH`` names Debian's Chromium.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from browser.bridge import BrowserError
from browser.origins import origin_allowed, origin_of

logger = logging.getLogger(__name__)
_BACKGROUND: set[asyncio.Future] = set()
"""Fire-and-forget tasks, held until they end."""

SNAPSHOT_JS = (Path(__file__).resolve().parent.parent / "chrome_extension" / "snapshot.js").read_text()
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
_RUN = "([op, params]) => globalThis.__apBrowser.run(op, params)"
READ_ONLY_OPS = frozenset({"snapshot", "get_text", "wait_for"})
"""Ops that may be run again when a navigation interrupts them (they change nothing)."""
RESULT_CACHE_SIZE = 200
"""Recent results kept per session, by idempotency key (a replayed call is not acted twice)."""


@dataclass
class _Session:
    context: Any
    pages: list[Any] = field(default_factory=list)
    current: Any = None
    next_ref: int = 1
    last_used: float = field(default_factory=time.monotonic)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ServerBrowserPool:
    """Chromium and the per-session contexts of one event loop."""

    def __init__(self) -> None:
        self._playwright: Any = None
        self._browser: Any = None
        self._sessions: dict[str, _Session] = {}
        self._start_lock = asyncio.Lock()
        self._reaper: asyncio.Task | None = None

    async def _ensure_browser(self) -> Any:
        async with self._start_lock:
            if self._browser is None or not self._browser.is_connected():
                from playwright.async_api import async_playwright

                if self._playwright is None:
                    self._playwright = await async_playwright().start()
                try:
                    self._browser = await self._playwright.chromium.launch(
                        executable_path=settings.BROWSER_CHROMIUM_PATH, headless=settings.BROWSER_SERVER_HEADLESS,
                        args=LAUNCH_ARGS,
                    )
                except Exception as exc:  # Playwright raises its own Error for a missing/broken binary
                    raise BrowserError("browser_unavailable",
                                       f"The server browser could not start: {exc}".splitlines()[0]) from exc
                self._sessions.clear()
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.create_task(self._reap_forever())
            return self._browser

    async def _session(self, key: str) -> _Session:
        session = self._sessions.get(key)
        if session is None:
            browser = await self._ensure_browser()
            context = await browser.new_context(viewport={"width": 1280, "height": 800})
            await context.add_init_script(script=SNAPSHOT_JS)
            session = _Session(context=context)
            self._sessions[key] = session
        session.last_used = time.monotonic()
        return session

    async def close_idle(self, *, idle_seconds: float | None = None) -> int:
        """Close contexts unused for ``idle_seconds`` (default: the setting). Returns how many."""
        limit = settings.BROWSER_SERVER_IDLE_SECONDS if idle_seconds is None else idle_seconds
        now = time.monotonic()
        closed = 0
        for key, session in list(self._sessions.items()):
            if now - session.last_used >= limit and not session.lock.locked():
                self._sessions.pop(key, None)
                try:
                    await session.context.close()
                except Exception:  # a context of a crashed browser: nothing left to close
                    logger.debug("closing the context of %s failed", key, exc_info=True)
                closed += 1
        return closed

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(max(5.0, settings.BROWSER_SERVER_IDLE_SECONDS / 10))
            await self.close_idle()

    async def shutdown(self) -> None:
        """Close every context, the browser and Playwright (tests, worker shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for session in list(self._sessions.values()):
            try:
                await session.context.close()
            except Exception:
                pass
        self._sessions.clear()
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None

    def session_keys(self) -> list[str]:
        return list(self._sessions)

    async def execute(self, *, key: str, op: str, params: dict[str, Any], deadline_ms: int,
                      idempotency_key: str) -> dict[str, Any]:
        """Run ``op`` in the session ``key``'s context (see :class:`browser.tools.BrowserBackend`)."""
        session = await self._session(key)
        async with session.lock:
            if idempotency_key in session.results:
                return session.results[idempotency_key]
            try:
                result = await asyncio.wait_for(self._execute(session, op, params, deadline_ms), deadline_ms / 1000)
            except TimeoutError as exc:
                raise BrowserError("timeout", f"{op!r} did not finish within {deadline_ms / 1000:g} s.") from exc
            session.results[idempotency_key] = result
            while len(session.results) > RESULT_CACHE_SIZE:
                session.results.pop(next(iter(session.results)))
            session.last_used = time.monotonic()
            return result

    # -- operations -------------------------------------------------------------------------

    def _check_origin(self, url: str, policy: dict[str, Any], *, redirected: bool = False) -> None:
        if not origin_allowed(url, allowed=policy.get("allowed_origins", []), blocked=policy.get("blocked_origins", [])):
            how = "was redirected to" if redirected else "is on"
            raise BrowserError("origin_blocked",
                               f"The tab {how} {origin_of(url)}, which this agent may not use (blocked by the "
                               "browser capability's origin rules).")

    async def _page(self, session: _Session, *, create: bool) -> Any:
        if session.current is not None and not session.current.is_closed():
            return session.current
        session.pages = [p for p in session.pages if not p.is_closed()]
        if session.pages:
            session.current = session.pages[-1]
            return session.current
        if not create:
            raise BrowserError("no_tab", "No tab is open for this chat: call browser_navigate or browser_tabs action=new.")
        page = await session.context.new_page()
        session.pages.append(page)
        session.current = page
        return page

    async def _tabs(self, session: _Session) -> dict[str, Any]:
        session.pages = [p for p in session.pages if not p.is_closed()]
        tabs = []
        for i, page in enumerate(session.pages):
            tabs.append({"id": i + 1, "url": page.url, "title": await page.title(), "selected": page is session.current})
        current = session.current
        return {"tabs": tabs, "url": current.url if current else "", "title": await current.title() if current else ""}

    async def _execute(self, session: _Session, op: str, params: dict[str, Any], deadline_ms: int) -> dict[str, Any]:
        policy = params.get("policy") or {}
        if op == "tabs":
            action = params.get("action", "list")
            if action == "new":
                url = params.get("url") or "about:blank"
                self._check_origin(url, policy)
                page = await session.context.new_page()
                session.pages.append(page)
                session.current = page
                if url != "about:blank":
                    await page.goto(url, timeout=deadline_ms)
            elif action in ("select", "close"):
                pages = [p for p in session.pages if not p.is_closed()]
                index = int(params.get("tab_id", 0)) - 1
                if not 0 <= index < len(pages):
                    raise BrowserError("no_such_tab", f"No tab {params.get('tab_id')}; call browser_tabs action=list.")
                if action == "select":
                    session.current = pages[index]
                else:
                    await pages[index].close()
                    if session.current is pages[index]:
                        session.current = None
            return await self._tabs(session)
        if op == "navigate":
            url = params["url"]
            self._check_origin(url, policy)
            page = await self._page(session, create=True)
            try:
                await page.goto(url, timeout=deadline_ms, wait_until="load")
            except Exception as exc:
                if type(exc).__name__ == "TimeoutError":
                    raise BrowserError("timeout", f"{url} did not load within {deadline_ms / 1000:g} s.") from exc
                raise BrowserError("navigation_failed", f"Could not open {url}: {str(exc).splitlines()[0]}") from exc
            if page.url != url:
                self._check_origin_after(page, policy)
            else:
                self._check_origin(page.url, policy)
            return {"url": page.url, "title": await page.title(), "navigated": True}
        page = await self._page(session, create=False)
        self._check_origin(page.url, policy)
        if op == "screenshot":
            png = await page.screenshot(type="png")
            return {"url": page.url, "title": await page.title(), "png_base64": base64.b64encode(png).decode()}
        if op == "snapshot":
            params = dict(params, ref_start=session.next_ref)
        before = page.url
        answer = await self._run_script(page, op, params)
        if not answer.get("ok"):
            error = answer.get("error") or {}
            raise BrowserError(error.get("code", "page_error"), error.get("message", "The page script failed."))
        result = answer["result"]
        if op == "snapshot":
            session.next_ref = max(session.next_ref, int(result.get("next_ref", session.next_ref)))
        if result.get("navigating"):
            if result.get("committed") and page.url != before:
                await page.wait_for_load_state("load", timeout=deadline_ms)
            else:  # page.url can lag a navigation the page itself started: wait for it
                await self._wait_navigation(page, deadline_ms)
            url, title = await self._location(page)
            self._check_origin_after(page, policy, url)
            result = {"url": url, "title": title, "navigated": True}
        return result

    async def _location(self, page: Any) -> tuple[str, str]:
        """URL and title read together from the document now in the page (never one from the old
        document and one from the new)."""
        for _ in range(3):
            try:
                href, title = await page.evaluate("() => [location.href, document.title]")
                return href, title
            except Exception as exc:
                if "context was destroyed" not in str(exc).lower():
                    raise
                await page.wait_for_load_state("load")
        return page.url, await page.title()

    def _check_origin_after(self, page: Any, policy: dict[str, Any], url: str | None = None) -> None:
        try:
            self._check_origin(url or page.url, policy, redirected=True)
        except BrowserError:
            # Do not leave the agent on a blocked page; hold the task until it ends (a dropped
            # task may be garbage-collected mid-flight).
            task = asyncio.ensure_future(page.goto("about:blank"))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            raise

    async def _run_script(self, page: Any, op: str, params: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(2):
            try:
                has = await page.evaluate("() => !!(globalThis.__apBrowser)")
                if not has:
                    await page.evaluate(SNAPSHOT_JS)
                return await page.evaluate(_RUN, [op, params])
            except Exception as exc:
                if "context was destroyed" not in str(exc).lower():
                    raise BrowserError("page_error", f"The page could not run {op!r}: {str(exc).splitlines()[0]}") from exc
                if op not in READ_ONLY_OPS:
                    # The action ran and navigated the page before its answer came back: never run
                    # it again; report the navigation.
                    return {"ok": True, "result": {"navigating": True, "committed": True}}
                if attempt:
                    raise BrowserError("page_error", f"The page kept navigating while running {op!r}.") from exc
                await page.wait_for_load_state("load")
        raise AssertionError("unreachable")

    async def _wait_navigation(self, page: Any, deadline_ms: int) -> None:
        try:
            await page.wait_for_event("framenavigated", predicate=lambda f: f == page.main_frame,
                                      timeout=min(deadline_ms, 5000))
            await page.wait_for_load_state("load", timeout=deadline_ms)
        except Exception:  # the navigation had already happened, or never did: report where we are
            logger.debug("waiting for a navigation ended early", exc_info=True)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ServerBrowserPool] = weakref.WeakKeyDictionary()


def server_browser_pool() -> ServerBrowserPool:
    """This event loop's :class:`ServerBrowserPool` (created on first use)."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = ServerBrowserPool()
    return pool
