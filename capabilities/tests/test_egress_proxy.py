"""The sandbox's egress proxy (capabilities/egress.py) on the wire: one plain-HTTP request per
client connection, so a kept-alive connection never carries a request for another host to the
first server, unchecked (issue 34).

No sandbox: a raw client on the proxy's Unix socket, the way a confined program's bridge
reaches it. Two real servers: "A" on 127.0.0.1 (allowed: the tests set
``SANDBOX_EGRESS_ALLOWED_CIDRS = ["127.0.0.1/32"]``) and "B" on 127.0.0.2, same port, refused
like any loopback address unless a test allows it. Both record every request they receive.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from capabilities.egress import egress_socket_path
from capabilities.tests.http_test_server import serve, text

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture(autouse=True)
def only_a_is_allowed(settings: Any) -> None:
    settings.SANDBOX_EGRESS_ALLOWED_CIDRS = ["127.0.0.1/32"]


@pytest.fixture
def server_a() -> Iterator[Any]:
    with serve("127.0.0.1", {"/": text("page of A")}) as server:
        yield server


@pytest.fixture
def server_b(server_a: Any) -> Iterator[Any]:
    with serve("127.0.0.2", {"/secret": text("SECRET OF B")}, port=server_a.server_address[1]) as server:
        yield server


def _exchange(raw: bytes, *, wait_seconds: float = 5.0, then: bytes = b"") -> bytes:
    """Send ``raw`` on one connection to the egress proxy, read until it closes (or
    ``wait_seconds`` of silence); with ``then``, send it after the first answer arrived, on the
    same connection (a kept-alive client's next request) and read on."""
    received = b""
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(wait_seconds)
        client.connect(egress_socket_path())
        client.sendall(raw)
        pending = then
        while True:
            try:
                data = client.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            received += data
            if pending and b"\r\n\r\n" in received:
                time.sleep(0.2)
                try:
                    client.sendall(pending)
                except OSError:  # the proxy closed its side: the request went nowhere
                    pass
                pending = b""
    return received


def _get(url: str, host: str, *extra: str) -> bytes:
    return ("\r\n".join([f"GET {url} HTTP/1.1", f"Host: {host}", *extra]) + "\r\n\r\n").encode()


def test_a_pipelined_request_for_another_host_never_reaches_the_first_server(server_a: Any, server_b: Any) -> None:
    """The colleague's reproduction: two proxy requests written at once on one connection, the
    second for B (refused) with B's cookie. Before the fix the connection was spliced to A after
    the first request, and A received ``GET http://127.0.0.2:…/secret`` with the cookie."""
    port = server_a.server_address[1]
    answer = _exchange(
        _get(f"http://127.0.0.1:{port}/", f"127.0.0.1:{port}", "Connection: keep-alive")
        + _get(f"http://127.0.0.2:{port}/secret", f"127.0.0.2:{port}", "Cookie: session=of-b")
    )
    assert [path for path, _ in server_a.seen] == ["/"], server_a.seen
    assert server_b.seen == []
    assert answer.count(b"HTTP/1.") == 1, answer
    assert b"page of A" in answer and b"Connection: close" in answer
    assert server_a.seen[0][1].get("connection") == "close", "the upstream is told the exchange ends"


def test_a_kept_alive_clients_next_request_is_not_delivered_to_the_first_server(server_a: Any, server_b: Any) -> None:
    """A client that reuses the connection after reading the first answer (as HTTP clients
    do): the proxy has closed it, so the request for B goes nowhere; A sees one request."""
    port = server_a.server_address[1]
    answer = _exchange(_get(f"http://127.0.0.1:{port}/", f"127.0.0.1:{port}", "Connection: keep-alive"),
                       then=_get(f"http://127.0.0.2:{port}/secret", f"127.0.0.2:{port}", "Cookie: session=of-b"))
    assert [path for path, _ in server_a.seen] == ["/"], server_a.seen
    assert server_b.seen == []
    assert answer.count(b"HTTP/1.") == 1 and b"Connection: close" in answer, answer


def test_every_request_for_another_host_is_checked_on_its_own_connection(server_a: Any, server_b: Any,
                                                                          settings: Any) -> None:
    """The second request, sent again on a new connection as a client does after
    ``Connection: close``, is checked: refused while B is not allowed (B never reached), and
    delivered to B, never to A, once an operator allows B's network."""
    port = server_a.server_address[1]
    second = _get(f"http://127.0.0.2:{port}/secret", f"127.0.0.2:{port}", "Cookie: session=of-b")
    assert b"page of A" in _exchange(_get(f"http://127.0.0.1:{port}/", f"127.0.0.1:{port}"))

    refused = _exchange(second)
    assert refused.startswith(b"HTTP/1.1 403 "), refused
    assert b"Refused by the platform's egress rules: 127.0.0.2" in refused
    assert server_b.seen == []

    settings.SANDBOX_EGRESS_ALLOWED_CIDRS = ["127.0.0.1/32", "127.0.0.2/32"]
    allowed = _exchange(second)
    assert b"SECRET OF B" in allowed, allowed
    assert [path for path, _ in server_b.seen] == ["/secret"]
    assert [path for path, _ in server_a.seen] == ["/"]


class _RawServer:
    """A listener on 127.0.0.1 that reads one request (until ``request_bytes`` or 2 s of
    silence), records every byte, answers ``response`` and keeps the connection open until the
    test ends (a server that ignores ``Connection: close``)."""

    def __init__(self, response: bytes, *, request_bytes: int = 1 << 20) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = b""
        self.response = response
        self.request_bytes = request_bytes
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(2)
        try:
            while b"\r\n\r\n" not in self.received or len(self.received) < self.request_bytes:
                data = conn.recv(65536)
                if not data:
                    break
                self.received += data
                if b"\r\n\r\n" in self.received and len(self.received) >= self.request_bytes:
                    break
        except TimeoutError:
            pass
        conn.sendall(self.response)
        self.release.wait(20)
        conn.close()

    def close(self) -> None:
        self.release.set()
        self.listener.close()


def test_the_exchange_ends_after_the_declared_response_body() -> None:
    """A server that keeps the connection open despite ``Connection: close`` does not hold the
    program's request: the proxy relays the ``Content-Length`` bytes and closes."""
    server = _RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello", request_bytes=1)
    started = time.monotonic()
    try:
        answer = _exchange(_get(f"http://127.0.0.1:{server.port}/", f"127.0.0.1:{server.port}"), wait_seconds=15)
    finally:
        server.close()
    assert answer.endswith(b"\r\n\r\nhello") and b"Connection: close" in answer, answer
    assert b"keep-alive" not in answer
    assert time.monotonic() - started < 5


def test_a_request_body_goes_up_by_its_length_and_nothing_after_it() -> None:
    """A POST's body is relayed by ``Content-Length``; bytes after it (a pipelined request for
    another host) never reach the server. ``Proxy-*`` headers stay with the proxy."""
    server = _RawServer(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
    try:
        answer = _exchange(
            f"POST http://127.0.0.1:{server.port}/submit HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\nContent-Length: 5\r\n\r\nhello".encode()
            + _get(f"http://127.0.0.2:{server.port}/secret", f"127.0.0.2:{server.port}"),
            wait_seconds=15,
        )
    finally:
        server.close()
    head, _, body = server.received.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /submit HTTP/1.1\r\n"), server.received
    assert body == b"hello", server.received
    assert b"Proxy-Authorization" not in head and b"Connection: close" in head
    assert answer.startswith(b"HTTP/1.1 201 Created") and answer.endswith(b"ok"), answer


def test_a_chunked_request_body_is_refused_with_a_reason(server_a: Any) -> None:
    """The proxy could not tell where a chunked body ends without decoding it: 411, with the
    reason, and the server sees nothing."""
    port = server_a.server_address[1]
    answer = _exchange(f"POST http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 411 "), answer
    assert b"Content-Length" in answer.partition(b"\r\n\r\n")[2]
    assert server_a.seen == []


def test_a_server_that_closes_without_an_answer_is_a_502_with_the_reason() -> None:
    """The program reads why instead of an empty reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        answer = _exchange(_get(f"http://127.0.0.1:{port}/", f"127.0.0.1:{port}"), wait_seconds=15)
    finally:
        listener.close()
    assert answer.startswith(b"HTTP/1.1 502 "), answer
    assert b"closed the connection without an answer" in answer
