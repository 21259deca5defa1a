"""Cost of the SSRF-safe fetcher over a plain httpx GET, and of HTML → Markdown.

1. **Fetch overhead**: a ``python -m http.server`` child process on 127.0.0.1 serves a 10 KB
   file. Each iteration makes, in interleaved order, one plain GET with a fresh
   ``httpx.AsyncClient`` sharing one TLS context (what a naive tool would do: new client,
   httpx's own DNS and connect) and one :func:`capabilities.netsafe.safe_fetch` (resolve once, validate, pinned
   connect, peer check, capped streaming read). The host is given by name (``localhost`` is
   refused by name, so the bench uses the name ``bench.invalid`` mapped to 127.0.0.1 by a
   patched resolver, and the plain client uses 127.0.0.1). Reported: p50/p95 of both, and of
   the paired per-iteration differences.
2. **web_read conversion**: :func:`capabilities.builtin.web.html_to_markdown` on a generated
   ~200 KB article page (headings, paragraphs, links, lists, a table, scripts, navigation):
   CPU time per page.

Run: ``.venv/bin/python bench/web_fetch_overhead.py [--iterations 300]`` (no database).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(WEB_FETCH_ALLOWED_CIDRS=["127.0.0.1/32"], INSTALLED_APPS=[])
django.setup()

import httpx  # noqa: E402
from _stats import machine, percentile  # noqa: E402

from capabilities import netsafe  # noqa: E402
from llm import netrules  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _fake_getaddrinfo(host: str, port: int):
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


async def bench_fetch(iterations: int, port: int) -> None:
    netrules._getaddrinfo = _fake_getaddrinfo  # the name resolves to the local server
    plain_url, safe_url = f"http://127.0.0.1:{port}/file.bin", f"http://bench.invalid:{port}/file.bin"
    tls = httpx.create_ssl_context(trust_env=False)  # built once for both, as netsafe does
    plain, safe, diffs = [], [], []
    for i in range(iterations + 20):
        t0 = time.perf_counter()
        async with httpx.AsyncClient(trust_env=False, verify=tls) as client:
            r = await client.get(plain_url)
            assert r.status_code == 200 and len(r.content) == 10_000
        t1 = time.perf_counter()
        result = await netsafe.safe_fetch(safe_url)
        t2 = time.perf_counter()
        assert result.status_code == 200 and len(result.body) == 10_000
        if i >= 20:  # warm-up
            plain.append((t1 - t0) * 1000)
            safe.append((t2 - t1) * 1000)
            diffs.append(((t2 - t1) - (t1 - t0)) * 1000)
    print(f"fetch of 10 KB over loopback, {iterations} interleaved pairs")
    print(f"  plain httpx (fresh client)  p50 {percentile(plain, .5):6.2f} ms   p95 {percentile(plain, .95):6.2f} ms")
    print(f"  netsafe.safe_fetch          p50 {percentile(safe, .5):6.2f} ms   p95 {percentile(safe, .95):6.2f} ms")
    print(f"  paired difference           p50 {percentile(diffs, .5):+6.2f} ms   p95 {percentile(diffs, .95):+6.2f} ms")


def bench_markdown(pages: int) -> None:
    from capabilities.builtin.web import html_to_markdown

    section = ("<h2>Section {i}</h2><p>Paragraph with <a href='/link/{i}'>a link</a> and <b>bold</b> text. "
               + "Lorem ipsum dolor sit amet. " * 20 + "</p><ul><li>one</li><li>two</li></ul>"
               "<script>var x{i} = 1;</script>")
    html = ("<html><head><title>Bench</title><style>p{{}}</style></head><body><nav>"
            + "<a href='/n'>nav</a>" * 50 + "</nav><main><h1>Article</h1>"
            + "".join(section.format(i=i) for i in range(200))
            + "<table><tr><th>a</th><th>b</th></tr>" + "<tr><td>1</td><td>2</td></tr>" * 50
            + "</table></main><footer>foot</footer></body></html>")
    times = []
    for _ in range(pages):
        t0 = time.perf_counter()
        _, md = html_to_markdown(html, base_url="https://example.com/")
        times.append((time.perf_counter() - t0) * 1000)
    print(f"html_to_markdown of a {len(html) / 1000:.0f} KB page → {len(md) / 1000:.0f} KB Markdown, {pages} pages")
    print(f"  p50 {percentile(times, .5):6.1f} ms   p95 {percentile(times, .95):6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args()
    print(machine())
    port = _free_port()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "file.bin").write_bytes(b"x" * 10_000)
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                   "--directory", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            asyncio.run(bench_fetch(args.iterations, port))
        finally:
            server.terminate()
            server.wait(timeout=10)
    bench_markdown(30)


if __name__ == "__main__":
    main()
