"""Embedding throughput of the embedded embedder (all-MiniLM-L6-v2 on llama.cpp).

Starts ``scripts/llm_server.py`` with ``LLM_ROLE=embeddings`` (its own process, on a free
port; the GGUF model of ``scripts/setup_embedder.py`` unless ``--model`` names another, e.g.
an f32 conversion to compare), then embeds ~500-character chunks of real prose (this
repository's README.md and ARCHITECTURE.md, cut at word boundaries) through the platform's
client (``llm.embeddings.embed_texts``: HTTP, the openai SDK, normalisation), ``--batch``
texts per request, after one warm-up request. Prints embeddings per second, milliseconds per
chunk, tokens per chunk, the p50/p95 time of one request, and the server's CPU time per chunk
(user + system, all its threads: the figure that does not depend on how busy the machine is).

    .venv/bin/python bench/embedding_throughput.py                 # 256 chunks, batch 32
    .venv/bin/python bench/embedding_throughput.py --chunks 128 --batch 8 --threads 1

The figures depend on what else runs on the machine's cores (``uptime`` is printed).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def chunks_of_prose(count: int, size: int = 500) -> list[str]:
    """``count`` chunks of about ``size`` characters (whole words) from the repository's docs."""
    words = " ".join((ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "ARCHITECTURE.md")).split()
    chunks: list[str] = []
    current: list[str] = []
    length = 0
    for word in words * 4:
        if length + len(word) + 1 > size and current:
            chunks.append(" ".join(current))
            if len(chunks) == count:
                break
            current, length = [], 0
        current.append(word)
        length += len(word) + 1
    return chunks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=256, help="chunks to embed (default 256)")
    parser.add_argument("--batch", type=int, default=32, help="texts per request (default 32)")
    parser.add_argument("--chars", type=int, default=500, help="characters per chunk (default 500)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: usable CPUs)")
    parser.add_argument("--model", help="GGUF file to serve (default: scripts/setup_embedder.py's)")
    args = parser.parse_args()

    port = free_port()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")
    os.environ["OUTBOUND_ALLOWED_HOSTS"] = f"127.0.0.1:{port}"
    import django

    django.setup()
    from llm.embeddings import DEFAULT_EMBEDDING_MODEL, EmbeddingEndpoint, embed_texts

    sys.path.insert(0, str(ROOT / "scripts"))
    import llm_server
    import setup_embedder

    model = Path(args.model).resolve() if args.model else setup_embedder.ensure_embedder()
    env = {**os.environ, "LLM_ROLE": "embeddings", "EMBEDDINGS_PORT": str(port), "EMBEDDINGS_MODEL_PATH": str(model),
           "LLM_VERBOSE": "false"}
    if args.threads:
        env["LLM_N_THREADS"] = str(args.threads)
    log = open(ROOT / "var" / "log" / "bench-embeddings.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        if not llm_server.wait_ready(url, timeout_seconds=120):
            print("the embeddings server did not start; see var/log/bench-embeddings.log", file=sys.stderr)
            return 1
        endpoint = EmbeddingEndpoint(name="embedded", base_url=url)
        chunks = chunks_of_prose(args.chunks, args.chars)
        embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, chunks[: args.batch])  # warm-up
        tokens = _tokens_per_chunk(url, chunks[:32])
        request_seconds: list[float] = []
        cpu_before = _cpu_seconds(proc.pid)
        started = time.perf_counter()
        for start in range(0, len(chunks), args.batch):
            t0 = time.perf_counter()
            vectors = embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, chunks[start:start + args.batch],
                                  batch_size=args.batch)
            request_seconds.append(time.perf_counter() - t0)
            assert len(vectors) == len(chunks[start:start + args.batch])
        elapsed = time.perf_counter() - started
        server_cpu = _cpu_seconds(proc.pid) - cpu_before
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()

    request_seconds.sort()
    p95 = request_seconds[min(len(request_seconds) - 1, int(0.95 * len(request_seconds)))]
    print(f"model        {model.name} ({model.stat().st_size / 1e6:.1f} MB), threads {args.threads or 'all'}")
    print(f"load         {os.getloadavg()[0]:.2f} (1-minute load average, {os.cpu_count()} CPUs)")
    print(f"chunks       {len(chunks)} x ~{statistics.mean(len(c) for c in chunks):.0f} characters, "
          f"~{tokens:.0f} tokens each, batch {args.batch}")
    print(f"throughput   {len(chunks) / elapsed:.1f} embeddings/s ({1000 * elapsed / len(chunks):.1f} ms per chunk)")
    print(f"per request  p50 {1000 * statistics.median(request_seconds):.0f} ms, p95 {1000 * p95:.0f} ms")
    print(f"server CPU   {1000 * server_cpu / len(chunks):.1f} ms of CPU per chunk (user + system, all threads): "
          f"{len(chunks) / server_cpu:.1f} embeddings per CPU-second")
    return 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tokens_per_chunk(url: str, chunks: list[str]) -> float:
    import httpx

    root = re.sub(r"/v1/?$", "", url)
    counts = [httpx.post(f"{root}/extras/tokenize/count", json={"input": c}, timeout=30).json()["count"] for c in chunks]
    return statistics.mean(counts)


if __name__ == "__main__":
    sys.exit(main())
