"""Fixtures for the browser tests: test pages, paired devices, Chromium with the extension.

Playwright's sync API runs an event loop in the test's thread, and Django refuses ORM calls
from a thread with a running loop: database work and async code run through :func:`off_thread`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from browser.tests.site import LocalSite

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/lib/chromium/chromium")
EXTENSION_DIR = Path(__file__).resolve().parents[2] / "chrome_extension"
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]

_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="browser-test")
_pumps: list[tuple[int, Callable[[], None]]] = []
"""While a test waits, Playwright's sync API must keep processing its protocol messages: it
holds every new tab the extension opens paused (waiting for the debugger) until it has set the
tab up. :func:`pump` gives it that time; the fixtures register a pump while Chromium is open."""


def pump() -> None:
    """Let Playwright process events for ~20 ms (or sleep that long when no browser is open)."""
    if _pumps and _pumps[-1][0] == threading.get_ident():
        _pumps[-1][1]()
    else:
        time.sleep(0.02)


def _closing_connections(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from django.db import connections

    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()  # back to the pool, as at the end of a request


def submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
    """Start ``fn(*args, **kwargs)`` on one of the test threads, in the caller's context (its
    tenant scope); its future.

    The thread's database connections are closed after the call: a pool thread outlives the
    test, and a connection it kept open made the test database's teardown fail ("is being
    accessed by other users") at the end of the suite."""
    return _pool.submit(contextvars.copy_context().run, _closing_connections, fn, *args, **kwargs)


def off_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on another thread (no event loop there, see :func:`submit`);
    its result."""
    future = submit(fn, *args, **kwargs)
    deadline = time.monotonic() + 120
    while not future.done():
        if time.monotonic() > deadline:
            raise TimeoutError("off_thread call took longer than 120 s")
        pump()
    return future.result()


def run_async(coro_fn: Callable[[], Any]) -> Any:
    """``asyncio.run(coro_fn())`` on another thread; its result (exceptions re-raised)."""
    return off_thread(lambda: asyncio.run(coro_fn()))


def wait_until(predicate: Callable[[], Any], *, timeout_seconds: float = 20.0, what: str = "condition") -> Any:
    """Poll ``predicate`` (every 50 ms) until it returns a truthy value; fail after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        pump()


@pytest.fixture(autouse=True)
def test_sites_reachable(settings) -> None:
    """The server browser follows web_fetch's address rules: the local test pages (127.0.0.1)
    stand in for a public site, as in web_fetch's tests; every other address is judged by the
    real rules (browser/tests/test_server_addresses.py)."""
    settings.WEB_FETCH_ALLOWED_CIDRS = ["127.0.0.1/32"]


class FakeNames:
    """The address rules' one DNS lookup, patched (:func:`test_names`)."""

    def __init__(self) -> None:
        self.answers: dict[str, list[list[str]]] = {}
        """``name -> address lists``, consumed one per lookup (the last one repeats)."""
        self.lookups: list[str] = []
        """The ``.test`` names looked up, in order."""

    async def getaddrinfo(self, host: str, port: int, real: Callable[..., Any]) -> list[tuple[Any, ...]]:
        if not host.endswith(".test"):
            return await real(host, port)
        self.lookups.append(host)
        queue = self.answers.get(host) or [["127.0.0.1"]]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [(2 if ":" not in a else 10, 1, 6, "", (a, port)) for a in addresses]


@pytest.fixture
def test_names(monkeypatch) -> FakeNames:
    """Names under ``.test`` resolve to 127.0.0.1 for the address rules (the server browser's
    proxy and request interception), or to what ``answers[name]`` says; other names resolve as
    usual. Chromium resolves nothing itself."""
    from llm import netrules

    names = FakeNames()
    real = netrules._getaddrinfo

    async def getaddrinfo(host: str, port: int) -> list[tuple[Any, ...]]:
        return await names.getaddrinfo(host, port, real)

    monkeypatch.setattr(netrules, "_getaddrinfo", getaddrinfo)
    return names


@pytest.fixture
def site() -> Iterator[LocalSite]:
    with LocalSite() as s:
        yield s


def pair_device_sync(*, tenant, user, name: str = "Test Chrome") -> tuple[Any, str]:
    """Run the pairing services end to end; returns ``(device, raw token)``."""
    from browser.services import browser_pairing_approve, browser_pairing_claim, browser_pairing_create

    issued = browser_pairing_create(name=name)
    browser_pairing_approve(code=issued.code, user=user, tenant=tenant)
    claim = browser_pairing_claim(pairing_id=issued.pairing.pk, poll_secret=issued.poll_secret)
    return claim.device, claim.token


@pytest.fixture
def needs_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


class ExtensionBrowser:
    """Chromium with the unpacked extension loaded (a persistent context: MV3 workers need it)."""

    def __init__(self, context: Any, extension_id: str) -> None:
        self.context = context
        self.extension_id = extension_id

    @property
    def worker(self) -> Any:
        workers = [w for w in self.context.service_workers if self.extension_id in w.url]
        if not workers:
            workers = [self.context.wait_for_event("serviceworker", timeout=15_000)]
        return workers[0]

    def state(self) -> dict[str, Any]:
        return self.worker.evaluate("() => globalThis.__apBridge.publicState()")

    def configure(self, *, platform_url: str, token: str) -> None:
        self.worker.evaluate(
            "async ([u, t]) => { await chrome.storage.local.set({platformUrl: u, deviceToken: t});"
            " await globalThis.__apBridge.connect(); }", [platform_url, token],
        )

    def wait_connected(self, timeout_seconds: float = 20.0) -> dict[str, Any]:
        return wait_until(lambda: (s := self._safe_state()) and s["status"] == "connected" and s,
                          timeout_seconds=timeout_seconds, what="the extension to connect")

    def _safe_state(self) -> dict[str, Any] | None:
        try:
            return self.state()
        except Exception:  # the worker is restarting
            return None

    def page_with_url(self, fragment: str, timeout_seconds: float = 10.0) -> Any:
        """The tab showing a URL containing ``fragment`` (``page.url`` lags navigations the
        extension makes, so ask the document itself)."""

        def find() -> Any:
            for page in self.context.pages:
                try:
                    if fragment in page.evaluate("location.href"):
                        return page
                except Exception:  # navigating: ask again
                    continue
            return None

        return wait_until(find, timeout_seconds=timeout_seconds, what=f"a tab at {fragment}")

    def open_extension_page(self, name: str) -> Any:
        page = self.context.new_page()
        page.goto(f"chrome-extension://{self.extension_id}/{name}")
        return page


@contextlib.contextmanager
def extension_browser(tmp_path: Path) -> Iterator[ExtensionBrowser]:
    from django.conf import settings
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=[*LAUNCH_ARGS, f"--disable-extensions-except={EXTENSION_DIR}", f"--load-extension={EXTENSION_DIR}"],
            viewport={"width": 1280, "height": 800},
        )
        idle_page = context.pages[0] if context.pages else context.new_page()
        _pumps.append((threading.get_ident(), lambda: idle_page.wait_for_timeout(20)))
        try:
            browser = ExtensionBrowser(context, settings.BROWSER_EXTENSION_IDS[0])
            assert browser.worker.evaluate("chrome.runtime.id") == browser.extension_id
            yield browser
        finally:
            _pumps.pop()
            context.close()
