"""Browser command round trip and snapshot sizes.

1. Round trip server → extension → page → server for a click on a local page: the real ASGI
   app (uvicorn, in this process), Redis, headless Chromium (Debian's) with the unpacked
   extension; each command goes through ``browser.bridge.bridge_execute`` exactly as a run's
   tool sends it (presence lookup, channel layer send, consumer, WebSocket, service worker,
   chrome.scripting in the page, result back through Redis). Target: p50 ≤ 20 ms.
2. The same click on the server-side Playwright backend, for comparison.
3. Snapshot size in tokens (llm.tokens estimate) of the test pages. Target ≤ 2,000 for a
   typical form page (``/form``).

Run: ``.venv/bin/python bench/browser_roundtrip.py [--clicks 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import tempfile
import threading
import time
import uuid

from _harness import summary
from django.conf import settings
from django.contrib.auth import get_user_model

from browser.bridge import bridge_execute
from browser.tests.conftest import extension_browser, pair_device_sync
from browser.tests.site import LocalSite
from browser.tools import BrowserClick, BrowserConfig, BrowserNavigate, BrowserRun, BrowserSnapshot
from capabilities.tools import ToolContext
from llm.tokens import estimate_text_tokens
from tenants.models import Role, Tenant
from tenants.services import membership_create, tenant_create

PAGES = ["/form", "/login", "/search", "/list", "/counter"]


def _serve_asgi() -> tuple[str, object]:
    import socket

    import uvicorn

    from agent_platform.asgi import application
    from agent_platform.web import SERVER_OPTIONS

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           **SERVER_OPTIONS))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def _in_thread(fn):
    """``fn()`` on a thread of its own; meanwhile this thread lets Playwright process its events
    (it keeps tabs the extension opens paused until it has set them up)."""
    from browser.tests.conftest import pump

    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    while t.is_alive():
        pump()
    if "error" in box:
        raise box["error"]
    return box["value"]


def extension_figures(*, tenant_id: int, user_id: int, site: LocalSite, clicks: int) -> tuple[list[float], dict[str, int]]:
    policy = {"allowed_origins": [], "blocked_origins": []}

    async def cmd(op, params, key, deadline_ms=10_000):
        return await bridge_execute(tenant_id=tenant_id, user_id=user_id, op=op,
                                    params=dict(params, session_id=1, approved=False, policy=policy),
                                    deadline_ms=deadline_ms, idempotency_key=key)

    async def main():
        sizes = {}
        for page in PAGES:
            await cmd("navigate", {"url": site.url(page)}, f"nav{page}", 30_000)
            snap = await cmd("snapshot", {"max_chars": 80_000}, f"snap{page}")
            sizes[page] = estimate_text_tokens(snap["text"])
        await cmd("navigate", {"url": site.url("/counter")}, "nav-counter", 30_000)
        snap = await cmd("snapshot", {}, "snap-counter")
        ref = re.search(r'\[ref=(e\d+)\] button "Add one"', snap["text"]).group(1)
        for i in range(20):  # warm-up
            await cmd("click", {"ref": ref}, f"warm{i}")
        times = []
        for i in range(clicks):
            started = time.perf_counter()
            await cmd("click", {"ref": ref}, f"click{i}-{uuid.uuid4().hex[:6]}")
            times.append((time.perf_counter() - started) * 1000)
        return times, sizes

    return _in_thread(lambda: asyncio.run(main()))


def server_figures(*, site: LocalSite, clicks: int) -> list[float]:
    from browser.server_backend import server_browser_pool

    # The server browser follows web_fetch's address rules: the local page on 127.0.0.1
    # stands in for a public site, as in the browser tests.
    settings.WEB_FETCH_ALLOWED_CIDRS = ["127.0.0.1/32"]

    async def main():
        run = BrowserRun(config=BrowserConfig(backend="server"))
        calls = iter(range(1, 10**6))

        def ctx():
            return ToolContext(tenant_id=1, session_id=10**9, run_id=1, tool_call_id=next(calls), user_id=1)

        await BrowserNavigate(run).execute({"url": site.url("/counter")}, ctx())
        text = (await BrowserSnapshot(run).execute({}, ctx())).content
        ref = re.search(r'\[ref=(e\d+)\] button "Add one"', text).group(1)
        times = []
        try:
            for i in range(20 + clicks):
                started = time.perf_counter()
                await BrowserClick(run).execute({"ref": ref}, ctx())
                if i >= 20:
                    times.append((time.perf_counter() - started) * 1000)
        finally:
            await server_browser_pool().shutdown()
        return times

    return _in_thread(lambda: asyncio.run(main()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=200)
    args = parser.parse_args()
    slug = f"bench-{uuid.uuid4().hex[:8]}"
    tenant = tenant_create(name=slug, slug=slug)
    user = get_user_model().objects.create_user(username=slug)
    membership_create(tenant=tenant, user=user, role=Role.MEMBER)
    _, token = pair_device_sync(tenant=tenant, user=user, name="bench")
    base_url, server = _serve_asgi()
    try:
        with LocalSite() as site, tempfile.TemporaryDirectory() as tmp:
            from pathlib import Path

            with extension_browser(Path(tmp)) as browser:
                browser.configure(platform_url=base_url, token=token)
                browser.wait_connected()
                ext_times, sizes = extension_figures(tenant_id=tenant.pk, user_id=user.pk, site=site, clicks=args.clicks)
            srv_times = server_figures(site=site, clicks=args.clicks)
    finally:
        server.should_exit = True
        user.delete()
        Tenant.objects.filter(pk=tenant.pk).delete()
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
          f"chromium {settings.BROWSER_CHROMIUM_PATH}")
    print(f"click round trip, extension (server → extension → page → server): {summary(ext_times)}")
    print(f"click round trip, server-side Playwright backend (tool call):      {summary(srv_times)}")
    print("snapshot size (estimated tokens, whole page, no budget):")
    for page, tokens in sizes.items():
        print(f"  {page:10s} {tokens:5d}")


if __name__ == "__main__":
    main()
