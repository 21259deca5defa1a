"""The server browser and the platform's address rules (issue 34): the same checks as web_fetch
for every request Chromium makes, whatever the tenant's origin rules say (here: none, which
allows every origin), and Chromium never running as root.

Two real servers: a "public" one on 127.0.0.1 (the tests allow exactly ``127.0.0.1/32`` through
``WEB_FETCH_ALLOWED_CIDRS``, as web_fetch's tests do) and an "internal" one on 127.0.0.2, same
port, refused like any loopback address; it records every request, so "it saw nothing" means
no connection carried a request to it. Names under ``.test`` resolve through the address
rules' patched lookup (``test_names``); Chromium itself resolves nothing.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from browser.proxy import REFUSED_HEADER, browser_proxy_address
from browser.tests.site import RecordingSite
from browser.tests.test_tools import ref, run_tools
from browser.tools import BrowserClick, BrowserGetText, BrowserNavigate, BrowserSnapshot, BrowserTabs, BrowserWaitFor
from capabilities.tools import ToolError

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("all_tenants_scope")]

INTERNAL_TEXT = "INTERNAL SECRET"


@pytest.fixture
def public() -> Any:
    """The stand-in for a public site (127.0.0.1, allowed by the autouse fixture)."""
    with RecordingSite("127.0.0.1", pages={"/": "<title>Public</title><h1>PUBLIC PAGE</h1>"}) as site:
        yield site


@pytest.fixture
def internal(public) -> Any:
    """An "internal" server on 127.0.0.2, on the public one's port."""
    pages = dict.fromkeys(("/", "/secret", "/submit", "/v1/models"), f"<title>Internal</title><h1>{INTERNAL_TEXT}</h1>")
    with RecordingSite("127.0.0.2", port=public.port, pages=pages) as site:
        yield site


async def _outcome(coro) -> str:
    """``"ok"``, or the ToolError's ``code: message``."""
    try:
        await coro
    except ToolError as exc:
        return f"{exc.code}: {exc.message}"
    return "ok"


# --------------------------------------------------------------------------------- browser_navigate

@pytest.mark.usefixtures("needs_chromium")
def test_navigating_to_loopback_private_or_metadata_addresses_fails_with_the_reason(public, internal, test_names):
    """Today's code let these through (only the tenant's origin rules were checked): the
    internal server answered, and the other addresses were dialled."""
    port = public.port
    test_names.answers["inward.test"] = [["127.0.0.2"]]
    targets = [
        f"http://127.0.0.2:{port}/secret",  # loopback, a server listens
        f"https://127.0.0.2:{port}/secret",  # the same through a CONNECT tunnel
        f"http://[::ffff:127.0.0.2]:{port}/secret",  # IPv4-mapped IPv6
        f"http://localhost:{port}/",  # the loopback name
        f"http://inward.test:{port}/secret",  # a name resolving inward
        "http://10.0.0.1/",  # RFC 1918 private
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://[fd00:ec2::254]/latest/meta-data/",  # cloud metadata over IPv6
    ]

    async def body(run, ctx, events, pool):
        outcomes = [await _outcome(BrowserNavigate(run).execute({"url": url}, ctx())) for url in targets]
        tabs = (await BrowserTabs(run).execute({"action": "list"}, ctx())).content
        opened = await _outcome(BrowserTabs(run).execute({"action": "new", "url": targets[0]}, ctx()))
        failed = [d.get("error_code") for kind, d in events if kind == "browser_operation" and d["status"] == "failed"]
        return outcomes, tabs, opened, failed

    outcomes, tabs, opened, failed = run_tools({"backend": "server"}, body)
    for url, outcome in zip(targets, outcomes, strict=True):
        assert outcome.startswith("blocked_address: Refused"), (url, outcome)
        assert "address rules" in outcome, outcome
    assert "127.0.0.2 is a loopback address" in outcomes[0]
    assert "'inward.test' (resolves to 127.0.0.2) is a loopback address" in outcomes[4]
    assert "10.0.0.1 is a private address" in outcomes[5]
    assert "169.254.169.254 is a cloud metadata address" in outcomes[6]
    assert opened.startswith("blocked_address: Refused")
    assert failed == ["blocked_address"] * (len(targets) + 1)
    assert INTERNAL_TEXT not in tabs and "127.0.0.2" not in tabs  # the tab was not left on the refused page
    assert internal.seen == []


@pytest.mark.usefixtures("needs_chromium")
def test_without_allowed_networks_the_model_server_and_the_console_on_loopback_are_refused(public, settings):
    """The issue's own case: ``http://127.0.0.1:8081/v1/models`` (the model server) and the
    console's login on loopback, with the production default (no allowed network)."""
    settings.WEB_FETCH_ALLOWED_CIDRS = []
    public.pages["/v1/models"] = '{"data": [{"id": "secret-model"}]}'
    public.pages["/admin/login/"] = "<title>Log in | Console</title>"

    async def body(run, ctx, events, pool):
        return [await _outcome(BrowserNavigate(run).execute({"url": public.url(path)}, ctx()))
                for path in ("/v1/models", "/admin/login/")]

    outcomes = run_tools({"backend": "server", "allowed_origins": []}, body)
    assert all(o.startswith("blocked_address: Refused: 127.0.0.1 is a loopback address") for o in outcomes), outcomes
    assert public.seen == []


# --------------------------------------------------------------------------- clicks, posts, redirects

@pytest.mark.usefixtures("needs_chromium")
def test_a_link_click_a_form_post_and_a_redirect_to_an_internal_address_are_refused(public, internal):
    """From an allowed page, each way of getting the tab onto 127.0.0.2 fails the call with the
    reason, and the internal server sees no request."""
    inside = internal.url("/secret")
    public.pages["/links"] = (
        f'<title>Links</title><a href="{inside}">Internal report</a> <a href="/go">Via redirect</a>'
        f'<form method="post" action="{internal.url("/submit")}"><input name="q" aria-label="Query" value="x">'
        '<button type="submit">Send</button></form>'
    )
    public.pages["/go"] = (302, {"Location": inside}, "")
    public.pages["/meta"] = (302, {"Location": "http://169.254.169.254/latest/meta-data/"}, "")

    async def body(run, ctx, events, pool):
        outcomes = {}
        for name, action in (("link", 'link "Internal report"'), ("redirecting link", 'link "Via redirect"'),
                             ("form post", 'button "Send"')):
            await BrowserNavigate(run).execute({"url": public.url("/links")}, ctx())
            snap = (await BrowserSnapshot(run).execute({}, ctx())).content
            outcomes[name] = await _outcome(BrowserClick(run).execute({"ref": ref(snap, action)}, ctx()))
        for path in ("/go", "/meta"):
            outcomes[path] = await _outcome(BrowserNavigate(run).execute({"url": public.url(path)}, ctx()))
        page_text = (await BrowserGetText(run).execute({"ref": "page"}, ctx())).content
        return outcomes, page_text

    outcomes, page_text = run_tools({"backend": "server"}, body)
    for name, outcome in outcomes.items():
        assert outcome.startswith("blocked_address: Refused"), (name, outcome)
    assert "127.0.0.2 is a loopback address" in outcomes["form post"]
    assert "169.254.169.254 is a cloud metadata address" in outcomes["/meta"]
    assert INTERNAL_TEXT not in page_text
    assert internal.seen == []
    assert [m for m, p, _ in public.seen if p in ("/go", "/meta")] == ["GET", "GET", "GET"]  # the redirecting pages did load


@pytest.mark.usefixtures("needs_chromium")
def test_subresources_of_an_allowed_page_never_reach_an_internal_address(public, internal, test_names):
    """Images, scripts' fetch/XHR/beacons, iframes, CSS, prefetch and a WebSocket (which
    request interception does not see: only the proxy stops it) aimed at 127.0.0.2, or at a
    name resolving there: the page loads, none of them reaches the internal server."""
    test_names.answers["inward.test"] = [["127.0.0.2"]]
    inside = internal.origin
    named = f"http://inward.test:{public.port}"
    public.pages["/page"] = f"""<!doctype html><title>Page</title>
<link rel="stylesheet" href="{inside}/style.css"><link rel="prefetch" href="{inside}/prefetch">
<style>body {{ background: url("{named}/bg.png"); }}</style>
<h1>Allowed page</h1><img src="{inside}/img.png"><img src="{named}/img2.png"><iframe src="{inside}/secret"></iframe>
<p id="status">waiting</p>
<script>
const done = [];
const note = (what) => {{ done.push(what); if (done.length === 4) document.getElementById('status').textContent = 'all settled'; }};
fetch("{inside}/v1/models", {{mode: "no-cors"}}).catch(() => null).finally(() => note('fetch'));
const x = new XMLHttpRequest(); x.open("POST", "{named}/submit"); x.onloadend = () => note('xhr'); x.send("a=1");
navigator.sendBeacon("{inside}/submit", "beacon");
const ws = new WebSocket("ws://127.0.0.2:{public.port}/socket");
ws.onerror = ws.onclose = () => note('ws');
setTimeout(() => note('timer'), 300);
</script>"""

    async def body(run, ctx, events, pool):
        nav = await BrowserNavigate(run).execute({"url": public.url("/page")}, ctx())
        await BrowserWaitFor(run).execute({"text": "all settled", "timeout_seconds": 15}, ctx())
        await asyncio.sleep(1.0)  # anything still in flight
        return nav.content

    content = run_tools({"backend": "server"}, body)
    assert "Title: Page" in content
    assert internal.seen == []
    assert [p for _, p, _ in public.seen] == ["/page"]  # nothing else reached the public side by mistake


# ------------------------------------------------------------------------------------------ DNS

@pytest.mark.usefixtures("needs_chromium")
def test_dns_rebinding_cannot_swap_the_address_between_check_and_connect(public, internal, test_names):
    """The first lookup of ``rebind.test`` answers the allowed 127.0.0.1, every later one the
    internal 127.0.0.2. Request interception looks first and lets the request go; the proxy
    looks again, sees 127.0.0.2 and refuses; it never dials an address it did not check, so the
    internal server sees nothing and the call fails with the reason."""
    test_names.answers["rebind.test"] = [["127.0.0.1"], ["127.0.0.2"]]

    async def body(run, ctx, events, pool):
        return await _outcome(BrowserNavigate(run).execute({"url": f"http://rebind.test:{public.port}/secret"}, ctx()))

    outcome = run_tools({"backend": "server"}, body)
    assert internal.seen == []
    assert outcome.startswith("blocked_address: Refused: 'rebind.test' (resolves to 127.0.0.2)"), outcome
    assert test_names.lookups[:2] == ["rebind.test", "rebind.test"]


# ------------------------------------------------------------------------------------- the proxy

def _proxy_exchange(raw: bytes) -> bytes:
    """Send ``raw`` to the proxy on one connection; everything it answers until it closes."""
    with socket.create_connection(browser_proxy_address(), timeout=10) as s:
        s.sendall(raw)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_the_proxy_dials_the_address_it_checked(public, internal, test_names):
    """One lookup per request: the first answer (allowed) is checked and dialled; the rebound
    answer is never used. The Host header keeps the name."""
    test_names.answers["rebind.test"] = [["127.0.0.1"], ["127.0.0.2"]]
    answer = _proxy_exchange(f"GET http://rebind.test:{public.port}/ HTTP/1.1\r\nHost: rebind.test:{public.port}\r\n\r\n"
                             .encode())
    assert answer.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")), answer[:200]
    assert b"PUBLIC PAGE" in answer and INTERNAL_TEXT.encode() not in answer
    assert test_names.lookups == ["rebind.test"] and internal.seen == []


def test_the_proxy_refuses_internal_destinations_with_the_reason(public, internal):
    for raw in (f"CONNECT 127.0.0.2:{public.port} HTTP/1.1\r\nHost: 127.0.0.2:{public.port}\r\n\r\n",
                f"GET http://127.0.0.2:{public.port}/secret HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n",
                "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n"):
        answer = _proxy_exchange(raw.encode())
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer[:200]
        assert f"{REFUSED_HEADER}: Refused: ".encode() in answer
    assert internal.seen == []


def test_a_kept_alive_proxy_connection_never_carries_a_second_request_to_the_first_upstream(public, internal):
    """Chromium reuses a proxy connection for plain-HTTP requests to any host. Were the
    connection spliced to the first upstream after its first request, a request for another
    host (with that host's cookies) would reach the first server. The proxy answers one request
    per connection, with ``Connection: close``."""
    raw = (f"GET {public.url('/')} HTTP/1.1\r\nHost: 127.0.0.1:{public.port}\r\nConnection: keep-alive\r\n\r\n"
           f"GET http://127.0.0.2:{public.port}/secret HTTP/1.1\r\nHost: 127.0.0.2:{public.port}\r\n"
           "Cookie: session=of-the-other-host\r\n\r\n").encode()
    answer = _proxy_exchange(raw)
    assert answer.count(b"HTTP/1.") == 1 and b"Connection: close" in answer
    assert [p for _, p, _ in public.seen] == ["/"] and internal.seen == []


def test_the_proxy_ends_the_exchange_after_the_declared_body_even_if_the_server_keeps_the_connection(public):
    """A server that ignores ``Connection: close`` does not hold the browser's request open:
    the proxy relays the ``Content-Length`` bytes and closes."""
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello")
        release.wait(20)  # keeps the connection open
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    started = time.monotonic()
    try:
        answer = _proxy_exchange(f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    finally:
        release.set()
        listener.close()
    assert answer.endswith(b"\r\n\r\nhello") and b"Connection: close" in answer
    assert time.monotonic() - started < 5


# ----------------------------------------------------------------------------------- privileges

def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _chromium_processes() -> list[dict[str, Any]]:
    processes = []
    for pid in _descendants(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if b"chromium" not in argv[0]:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        # a child process rewrites its command line as one string: join the arguments
        processes.append({"pid": pid, "command": " ".join(a.decode(errors="replace") for a in argv if a),
                          "uids": [int(u) for u in fields["Uid"].split()],
                          "seccomp": int(fields.get("Seccomp", "0").strip())})
    return processes


@pytest.mark.usefixtures("needs_chromium")
def test_chromium_never_runs_as_root_and_keeps_its_own_sandbox(public):
    """Today's code started Chromium as the worker's user (root here) with ``--no-sandbox``."""
    async def body(run, ctx, events, pool):
        await BrowserNavigate(run).execute({"url": public.url("/")}, ctx())
        return await asyncio.to_thread(_chromium_processes)

    processes = run_tools({"backend": "server"}, body)
    assert processes, "no Chromium process found under this test process"
    for p in processes:
        assert 0 not in p["uids"], p  # real, effective, saved and filesystem uid
        assert "--no-sandbox" not in p["command"], p["command"]
    if os.geteuid() == 0:
        from django.conf import settings

        assert {p["uids"][1] for p in processes} == {settings.BROWSER_SERVER_UID}
    renderers = [p for p in processes if "--type=renderer" in p["command"]]
    assert renderers and all(p["seccomp"] == 2 for p in renderers), renderers  # Chromium's seccomp sandbox is on
