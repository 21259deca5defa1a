"""A tiny threaded HTTP server on a real socket, for web_fetch / web_read tests.

``serve(host, routes)`` starts ``http.server.ThreadingHTTPServer`` on ``host`` (port 0, or
the given port) in a daemon thread. ``routes`` maps a path to a handler
``(request: BaseHTTPRequestHandler) -> None`` that writes the whole response. Every request is
recorded in ``server.seen`` as ``(path, headers dict)``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Handler = Callable[[BaseHTTPRequestHandler], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], routes: dict[str, Handler]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, dict[str, str]]] = []
        super().__init__(address, _RequestHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        server: _Server = self.server  # type: ignore[assignment]
        server.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        handler = server.routes.get(self.path.split("?", 1)[0])
        if handler is None:
            respond(self, 404, b"no such page", "text/plain")
            return
        try:
            handler(self)
        except (BrokenPipeError, ConnectionResetError):
            pass


def respond(request: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str | None,
            headers: dict[str, str] | None = None) -> None:
    """Write a complete response with Content-Length."""
    request.send_response(status)
    if content_type:
        request.send_header("Content-Type", content_type)
    for key, value in (headers or {}).items():
        request.send_header(key, value)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)


def text(body: str | bytes, content_type: str = "text/plain; charset=utf-8", status: int = 200,
         headers: dict[str, str] | None = None) -> Handler:
    raw = body.encode("utf-8") if isinstance(body, str) else body
    return lambda r: respond(r, status, raw, content_type, headers)


def redirect(location: str, status: int = 302) -> Handler:
    return lambda r: respond(r, status, b"", "text/plain", {"Location": location})


def hang(seconds: float) -> Handler:
    """Accept the request and send nothing for ``seconds``."""
    return lambda r: time.sleep(seconds)


def drip(seconds: float, every: float = 0.2) -> Handler:
    """Send headers at once, then one body byte every ``every`` seconds for ``seconds``."""

    def handler(r: BaseHTTPRequestHandler) -> None:
        r.send_response(200)
        r.send_header("Content-Type", "text/plain")
        r.send_header("Content-Length", "100000")
        r.end_headers()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            r.wfile.write(b"x")
            r.wfile.flush()
            time.sleep(every)

    return handler


@contextlib.contextmanager
def serve(host: str = "127.0.0.1", routes: dict[str, Handler] | None = None, port: int = 0) -> Iterator[_Server]:
    server = _Server((host, port), routes or {})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
