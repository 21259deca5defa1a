"""Local test pages for the browser tests and the benchmark (a real HTTP server on 127.0.0.1).

Pages:
- ``/login``: a login form (username, password) → ``/welcome?user=…``.
- ``/search``: a search box; "Search" renders results after a short async delay.
- ``/list``: a list whose "Shuffle" button re-renders every item (old refs go stale).
- ``/counter``: "Add one" and "Slow add" (busy for 3 s) buttons, and the count.
- ``/form``: a typical form page (the snapshot-size figure of the benchmark).
- ``/redirect?to=<url>``: a 302 to ``to``.
"""

from __future__ import annotations

import threading
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PAGES: dict[str, str] = {
    "/login": """<!doctype html><title>Login</title>
<nav aria-label="Site"><a href="/search">Search</a> <a href="/list">List</a></nav>
<main><h1>Sign in</h1>
<form action="/welcome" method="get">
  <label>Username <input name="user" autocomplete="username"></label>
  <label>Password <input type="password" name="pw"></label>
  <button type="submit">Sign in</button>
</form></main>""",
    "/search": """<!doctype html><title>Shop search</title>
<main><h1>Find products</h1>
<div role="search"><input type="search" aria-label="Search products" id="q">
<button id="go">Search</button></div>
<p id="status" role="status"></p><ul id="results"></ul></main>
<script>
const PRODUCTS = ['Kiwi fruit', 'Kiwi jam', 'Apple pie', 'Golden kiwi', 'Banana bread'];
document.getElementById('go').addEventListener('click', () => {
  const q = document.getElementById('q').value.trim().toLowerCase();
  document.getElementById('status').textContent = 'Searching…';
  setTimeout(() => {
    const hits = PRODUCTS.filter((p) => p.toLowerCase().includes(q));
    document.getElementById('results').innerHTML = hits.map((p, i) =>
      `<li><a href="/item/${i}">${p}</a></li>`).join('');
    document.getElementById('status').textContent = `${hits.length} results for ${q}`;
  }, 150);
});
</script>""",
    "/list": """<!doctype html><title>Todo list</title>
<main><h1>Todos</h1><button id="shuffle">Shuffle</button><ul id="items"></ul></main>
<script>
let items = ['Buy milk', 'Walk dog', 'Write tests'];
function render() {
  document.getElementById('items').innerHTML = items.map((t, i) =>
    `<li>${t} <button data-i="${i}" class="done">Done: ${t}</button></li>`).join('');
  for (const b of document.querySelectorAll('.done')) b.onclick = () => { items.splice(+b.dataset.i, 1); render(); };
}
document.getElementById('shuffle').onclick = () => { items = items.slice().reverse(); render(); };
render();
</script>""",
    "/counter": """<!doctype html><title>Counter</title>
<main><h1>Counter</h1><button id="add">Add one</button><button id="slow">Slow add</button>
<p id="count">Count: 0</p></main>
<script>
window.count = 0;
const show = () => { document.getElementById('count').textContent = 'Count: ' + window.count; };
document.getElementById('add').onclick = () => { window.count += 1; show(); };
document.getElementById('slow').onclick = () => {
  window.count += 1; show();
  const x = new XMLHttpRequest(); x.open('GET', '/hit', false); x.send();  // tells the test we are busy
  const end = Date.now() + 3000; while (Date.now() < end) {}  // a slow handler: 3 s busy
};
</script>""",
    "/form": """<!doctype html><title>Contact us</title>
<header><nav aria-label="Main"><a href="/">Home</a> <a href="/search">Products</a> <a href="/list">Todos</a>
<a href="/login">Sign in</a></nav></header>
<main><h1>Contact us</h1><p>We answer within two working days.</p>
<form action="/welcome" method="get">
  <label>Full name <input name="name" required></label>
  <label>Email <input type="email" name="email" required></label>
  <label>Phone <input type="tel" name="phone"></label>
  <label>Country <select name="country"><option>France</option><option>Germany</option><option>Italy</option>
    <option>Spain</option><option>United Kingdom</option></select></label>
  <fieldset><legend>Topic</legend>
    <label><input type="radio" name="topic" value="sales"> Sales</label>
    <label><input type="radio" name="topic" value="support"> Support</label>
    <label><input type="radio" name="topic" value="press"> Press</label></fieldset>
  <label>Message <textarea name="message"></textarea></label>
  <label><input type="checkbox" name="newsletter"> Send me the newsletter</label>
  <button type="submit">Send</button> <button type="reset">Clear</button>
</form></main>
<footer><a href="/privacy">Privacy</a> <a href="/terms">Terms</a></footer>""",
}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if parts.path == "/hit":
            self.server.hits += 1
            self.server.hit_event.set()
        if parts.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", query.get("to", ["/"])[0])
            self.end_headers()
            return
        if parts.path == "/welcome":
            body = f"<!doctype html><title>Welcome</title><main><h1>Welcome, {escape(query.get('user', [''])[0])}</h1></main>"
        elif parts.path.startswith("/item/"):
            body = f"<!doctype html><title>Item</title><main><h1>Item {escape(parts.path[6:])}</h1></main>"
        else:
            body = PAGES.get(parts.path, "<!doctype html><title>Home</title><main><h1>Home</h1></main>")
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class LocalSite:
    """The pages on a free port. ``url(path)`` uses 127.0.0.1; ``other_url(path)`` uses
    ``localhost`` (same server, another origin: for origin rules in the extension's browser);
    ``alias_url(path)`` uses ``site.test`` (another origin for the server browser, whose
    address rules refuse the name ``localhost``: the ``test_names`` fixture makes names under
    ``.test`` resolve to 127.0.0.1)."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.hits = 0  # type: ignore[attr-defined]
        self.server.hit_event = threading.Event()  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalSite:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def other_origin(self) -> str:
        return f"http://localhost:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path

    def other_url(self, path: str) -> str:
        return self.other_origin + path

    @property
    def alias_origin(self) -> str:
        return f"http://site.test:{self.port}"

    def alias_url(self, path: str) -> str:
        return self.alias_origin + path


class _RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _serve(self) -> None:
        server: RecordingSite = self.server.site  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        server.seen.append((self.command, self.path, body))
        page = server.pages.get(urlsplit(self.path).path)
        if page is None:
            status, headers, data = 404, {}, b"no such page"
        elif isinstance(page, tuple):
            status, headers, data = page[0], page[1], page[2].encode()
        else:
            status, headers, data = 200, {}, page.encode()
        self.send_response(status)
        self.send_header("Content-Type", headers.pop("Content-Type", "text/html; charset=utf-8"))
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _serve  # noqa: N815


class RecordingSite:
    """A server on ``host`` (port 0 or the given one) that records every request it receives
    as ``(method, path, body)`` in ``seen``, whatever the method.

    ``pages`` maps a path to an HTML string (200) or ``(status, headers, body)``; other paths
    answer 404. Stand-ins: 127.0.0.1 for a public site (tests allow ``127.0.0.1/32``), 127.0.0.2
    for an internal one (refused).
    """

    def __init__(self, host: str, *, port: int = 0, pages: dict | None = None) -> None:
        self.pages: dict = dict(pages or {})
        self.seen: list[tuple[str, str, bytes]] = []
        self.server = ThreadingHTTPServer((host, port), _RecordingHandler)
        self.server.daemon_threads = True
        self.server.site = self  # type: ignore[attr-defined]
        self.host = host
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingSite:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.origin + path
