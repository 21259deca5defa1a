"""The server-side browser: Playwright's async API driving the system Chromium.

One Chromium process per event loop (a Celery worker process hosts every run on one loop:
``sessions.runner.host``); one isolated browser context per chat session, closed when the
session has been idle for ``settings.BROWSER_SERVER_IDLE_SECONDS`` (default 600 s). The same
page script as the extension (``chrome_extension/snapshot.js``) is added to every document of
the context, so snapshots and refs behave the same on both backends.

Origins are checked here (the extension checks them in the user's browser): before acting on a
page, before navigating, and on the final URL after redirects. Origin rules are the tenant's;
the platform's address rules hold whatever they say:

- **Every connection goes through** :mod:`browser.proxy` (``--proxy-server``, no bypass even
  for loopback: ``--proxy-bypass-list=<-loopback>``), which resolves once, checks every address
  with web_fetch's rules (``WEB_FETCH_ALLOWED_CIDRS``) and dials the checked address: no
  loopback, private, link-local or metadata address, no DNS-rebinding window, for navigations,
  redirects, subresources, form posts, WebSockets and service workers alike. Chromium's own
  resolver answers nothing (``--host-resolver-rules``) and WebRTC may not send UDP outside the
  proxy.
- **Request interception** (:meth:`ServerBrowserPool._guard`, a second layer) aborts a request
  to a refused address before it leaves Chromium and keeps the reason, so a refused main-frame
  navigation (``browser_navigate``, a link click, a form post, a redirect hop) ends the tool
  call with ``blocked_address`` and that reason; refused subresources just fail to load.
- **Chromium runs unprivileged, with its own sandbox**: never ``--no-sandbox``; a root worker
  starts it through ``setpriv`` as ``BROWSER_SERVER_UID``/``_GID`` (65533) with no
  supplementary groups, no capabilities and ``no_new_privs`` (:func:`chromium_executable`).

Never downloads a browser through Playwright's installer: ``settings.BROWSER_CHROMIUM_PATH`` names Debian's Chromium.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import logging
import os
import shlex
import shutil
import tempfile
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from browser.bridge import BrowserError
from browser.origins import origin_allowed, origin_of
from browser.proxy import REFUSED_HEADER, browser_proxy_address
from capabilities.netsafe import FetchError, resolve_host

logger = logging.getLogger(__name__)
_BACKGROUND: set[asyncio.Future] = set()
"""Fire-and-forget tasks, held until they end."""

SNAPSHOT_JS = (Path(__file__).resolve().parent.parent / "chrome_extension" / "snapshot.js").read_text()
LAUNCH_ARGS = [
    "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
"""Chromium's switches besides the address ones of :func:`launch_args` (never ``--no-sandbox``)."""
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
GUARD_RESOLVE_SECONDS = 5.0
"""How long request interception waits for a DNS answer before leaving the verdict to the proxy."""
VERDICT_SECONDS = 10.0
VERDICTS_KEPT = 256
"""Request interception's verdicts per session: kept 10 s, at most 256 hosts (the proxy checks
every connection anyway)."""
LEAVE_TIMEOUT_MS = 5_000
"""How long a refused tab may take to go back to about:blank."""
REFUSALS_KEPT = 50
"""Refused main-frame navigations remembered per session (the latest ones)."""
CHROMIUM_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "TZ")
"""The only variables of the worker's environment Chromium gets (never its secrets)."""
_RUN = "([op, params]) => globalThis.__apBrowser.run(op, params)"
READ_ONLY_OPS = frozenset({"snapshot", "get_text", "wait_for"})
"""Ops that may be run again when a navigation interrupts them (they change nothing)."""
RESULT_CACHE_SIZE = 200
"""Recent results kept per session, by idempotency key (a replayed call is not acted twice)."""


def launch_args(proxy: tuple[str, int]) -> list[str]:
    """Chromium's switches: :data:`LAUNCH_ARGS` and every connection through ``proxy``
    (``(host, port)`` of :mod:`browser.proxy`), loopback included, no name resolved by Chromium
    itself but the proxy's, and no WebRTC UDP outside the proxy."""
    host, port = proxy
    return [
        *LAUNCH_ARGS, f"--proxy-server=http://{host}:{port}", "--proxy-bypass-list=<-loopback>",
        f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {host}",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    ]


_WRAPPER = """#!/bin/sh
# Written by browser/server_backend.py: Chromium as the unprivileged sandbox user.
set -e
profile=""
for arg in "$@"; do
  case "$arg" in
    --user-data-dir=*) profile="${{arg#--user-data-dir=}}" ;;
  esac
done
if [ -n "$profile" ]; then
  chown -R {uid}:{gid} "$profile"
  HOME="$profile"; XDG_CONFIG_HOME="$profile/.config"; XDG_CACHE_HOME="$profile/.cache"
  export HOME XDG_CONFIG_HOME XDG_CACHE_HOME
fi
exec {setpriv} --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- {chromium} "$@"
"""
_wrappers: dict[tuple[str, int, int], str] = {}
_wrappers_lock = threading.Lock()


def chromium_executable() -> str:
    """What Playwright starts: ``settings.BROWSER_CHROMIUM_PATH`` itself when the worker is not
    root; for a root worker, a wrapper script (written once per process into a fresh temp
    directory) that hands Playwright's profile directory to ``BROWSER_SERVER_UID``/``_GID``
    (65533: not the confined programs' ``SANDBOX_UID``, whose process limit is counted per uid)
    and starts Chromium through ``setpriv`` as that user (no groups, no capabilities,
    ``no_new_privs``), so no Chromium process runs as root.

    Raises:
        BrowserError: ``browser_unavailable`` when the worker is root and ``setpriv`` is missing.
    """
    chromium = settings.BROWSER_CHROMIUM_PATH
    if os.geteuid() != 0:
        return chromium
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise BrowserError("browser_unavailable", "The server browser cannot start: the worker runs as root and "
                                                  "setpriv (util-linux) is not installed to drop root for Chromium.")
    key = (chromium, settings.BROWSER_SERVER_UID, settings.BROWSER_SERVER_GID)
    with _wrappers_lock:
        path = _wrappers.get(key)
        if path is None or not os.path.exists(path):
            directory = tempfile.mkdtemp(prefix="ap-chromium-")
            atexit.register(shutil.rmtree, directory, True)
            os.chmod(directory, 0o755)
            path = os.path.join(directory, "chromium")
            with open(path, "w") as f:
                f.write(_WRAPPER.format(uid=int(key[1]), gid=int(key[2]), setpriv=shlex.quote(setpriv),
                                        chromium=shlex.quote(chromium)))
            os.chmod(path, 0o755)
            _wrappers[key] = path
        return path


def chromium_env() -> dict[str, str]:
    """Chromium's environment: :data:`CHROMIUM_ENV_NAMES` of the worker's (no secrets) and
    ``HOME`` (the worker's; the wrapper of a root worker points it at the profile)."""
    env = {name: os.environ[name] for name in CHROMIUM_ENV_NAMES if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = os.environ.get("HOME") or tempfile.gettempdir()
    return env


async def address_refusal(url: str, *, verdicts: dict[tuple[str, int], tuple[float, str | None]] | None = None
                          ) -> str | None:
    """Why the server browser may not connect to ``url``'s host, or None if it may (or if only
    the proxy can tell: a name that does not resolve, a slow resolver, a scheme without a host).

    Uses web_fetch's rules (:func:`capabilities.netsafe.resolve_host`, with
    ``WEB_FETCH_ALLOWED_CIDRS``). The proxy checks again at connect time; this answer only
    gives the model the reason sooner, so it may be reused: ``verdicts`` (a session's cache,
    ``(host, port) -> (expiry on the monotonic clock, verdict)``) keeps each one
    :data:`VERDICT_SECONDS` (at most :data:`VERDICTS_KEPT` entries).

    Returns:
        web_fetch's message, e.g. "Refused: 127.0.0.2 is a loopback address. Only public
        internet addresses can be fetched.", or None.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        return None
    key = (parts.hostname, port)
    now = time.monotonic()
    if verdicts is not None and key in verdicts and verdicts[key][0] > now:
        return verdicts[key][1]
    verdict: str | None = None
    try:
        await asyncio.wait_for(resolve_host(parts.hostname, port), GUARD_RESOLVE_SECONDS)
    except FetchError as exc:
        verdict = exc.message if exc.code == "blocked_address" else None
    except TimeoutError:
        return None
    if verdicts is not None:
        verdicts[key] = (now + VERDICT_SECONDS, verdict)
        while len(verdicts) > VERDICTS_KEPT:
            verdicts.pop(next(iter(verdicts)))
    return verdict


def _main_frame_navigation(request: Any) -> bool:
    """Whether ``request`` loads a tab's top document (not an iframe, a subresource or a worker)."""
    try:
        return bool(request.is_navigation_request()) and request.frame.parent_frame is None
    except Exception:  # a service worker's request has no frame
        return False


@dataclass
class _Session:
    context: Any = None
    pages: list[Any] = field(default_factory=list)
    current: Any = None
    next_ref: int = 1
    last_used: float = field(default_factory=time.monotonic)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    refusals: list[tuple[str, str]] = field(default_factory=list)
    """``(code, message)`` of the latest refused main-frame navigations (at most :data:`REFUSALS_KEPT`)."""
    refusal_count: int = 0
    verdicts: dict[tuple[str, int], tuple[float, str | None]] = field(default_factory=dict)
    """Request interception's recent verdicts (:func:`address_refusal`)."""
    """Refused main-frame navigations so far (an operation compares it before and after)."""

    def refuse(self, code: str, message: str) -> None:
        """Remember a refused main-frame navigation."""
        self.refusals.append((code, message))
        del self.refusals[:-REFUSALS_KEPT]
        self.refusal_count += 1


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
                        executable_path=chromium_executable(), headless=settings.BROWSER_SERVER_HEADLESS,
                        args=launch_args(browser_proxy_address()), chromium_sandbox=True, env=chromium_env(),
                    )
                except BrowserError:
                    raise
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
            context = await browser.new_context(viewport={"width": 1280, "height": 800}, service_workers="block")
            await context.add_init_script(script=SNAPSHOT_JS)
            session = _Session(context=context)

            async def guard(route: Any) -> None:  # one parameter: Playwright passes the request to a second
                await self._guard(route, session)

            await context.route("**/*", guard)
            context.on("response", lambda response: self._on_response(response, session))
            context.on("requestfailed", lambda request: self._on_request_failed(request, session))
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

    # -- address rules ----------------------------------------------------------------------

    async def _guard(self, route: Any, session: _Session) -> None:
        """Request interception: abort a request to a refused address (remembering the reason
        of a refused main-frame navigation), let every other one go on to the proxy."""
        request = route.request
        try:
            reason = await address_refusal(request.url, verdicts=session.verdicts)
            if reason is None:
                await route.continue_()
                return
            logger.info("server browser: refused %s: %s", request.url[:200], reason)
            if _main_frame_navigation(request):
                session.refuse("blocked_address", self._refusal_message(request.url, reason))
            await route.abort("blockedbyclient")
        except Exception:  # the page or the context closed meanwhile
            logger.debug("request interception of %s ended early", request.url[:200], exc_info=True)

    def _on_response(self, response: Any, session: _Session) -> None:
        """The proxy answered a main-frame navigation itself (a refusal request interception
        could not see, such as a DNS-rebinding answer): remember its reason."""
        reason = response.headers.get(REFUSED_HEADER.lower())
        if reason and _main_frame_navigation(response.request):
            code = "blocked_address" if response.status == 403 else "navigation_failed"
            session.refuse(code, self._refusal_message(response.url, reason))

    def _on_request_failed(self, request: Any, session: _Session) -> None:
        """The proxy refused an https (CONNECT) main-frame navigation that request interception
        let through: Chromium only says the tunnel failed."""
        failure = request.failure or ""
        if "ERR_TUNNEL_CONNECTION_FAILED" in failure and _main_frame_navigation(request):
            session.refuse("blocked_address", self._refusal_message(
                request.url, "Refused, or not reachable, through the platform's address rules."))

    @staticmethod
    def _refusal_message(url: str, reason: str) -> str:
        return (f"{reason} The server browser did not load {origin_of(url)} (the platform's address rules for "
                "web tools; the agent's origin rules cannot allow it).")

    async def _raise_if_refused(self, session: _Session, page: Any, mark: int) -> None:
        """Fail the operation if a main-frame navigation was refused since ``mark`` (the
        session's ``refusal_count`` when the operation began), leaving the tab blank (before
        the call ends: a later call must not race that navigation)."""
        if session.refusal_count > mark:
            code, message = session.refusals[-1]
            try:
                await page.goto("about:blank", timeout=LEAVE_TIMEOUT_MS)
            except Exception:  # a closed or crashed page: nothing to leave
                logger.debug("leaving a refused page failed", exc_info=True)
            raise BrowserError(code, message)

    @staticmethod
    def _leave(page: Any) -> None:
        """Send the tab to about:blank, holding the task until it ends (a dropped task may be
        garbage-collected mid-flight)."""
        task = asyncio.ensure_future(page.goto("about:blank"))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)

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

    async def _goto(self, session: _Session, page: Any, url: str, deadline_ms: int) -> None:
        """Load ``url`` in ``page``; a refused address is ``blocked_address`` with the reason."""
        mark = session.refusal_count
        try:
            await page.goto(url, timeout=deadline_ms, wait_until="load")
        except Exception as exc:
            await self._raise_if_refused(session, page, mark)
            if type(exc).__name__ == "TimeoutError":
                raise BrowserError("timeout", f"{url} did not load within {deadline_ms / 1000:g} s.") from exc
            raise BrowserError("navigation_failed", f"Could not open {url}: {str(exc).splitlines()[0]}") from exc
        await self._raise_if_refused(session, page, mark)

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
                    await self._goto(session, page, url, deadline_ms)
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
            await self._goto(session, page, url, deadline_ms)
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
        mark = session.refusal_count
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
            await self._raise_if_refused(session, page, mark)
            url, title = await self._location(page)
            self._check_origin_after(page, policy, url)
            result = {"url": url, "title": title, "navigated": True}
        await self._raise_if_refused(session, page, mark)
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
            self._leave(page)  # do not leave the agent on a blocked page
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
