"""A fake OpenAI-compatible ``POST /v1/embeddings`` server for tests that need no real model: models
named ``hash-<seed>-<dimensions>`` give deterministic bag-of-words vectors (each word a
pseudo-random direction drawn from ``(seed, word)``), so two seeds are two unrelated vector
spaces of any size, and texts sharing words are near each other in one space. It can be told
to fail (HTTP 503) after a number of requests.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import math
import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@functools.cache
def _word_vector(seed: str, dimensions: int, word: str) -> tuple[float, ...]:
    rng = random.Random(f"{seed}:{word}")
    return tuple(rng.gauss(0.0, 1.0) for _ in range(dimensions))


def fake_embedding(model: str, text: str) -> list[float]:
    """The unit vector the fake server returns for ``text`` with ``model``: ``hash-<seed>-<dims>``,
    or any other name as a seed of 384 dimensions (e.g. the embedded model's name)."""
    match = re.fullmatch(r"hash-(\w+)-(\d+)", model)
    seed, dimensions = (match.group(1), int(match.group(2))) if match else (model, 384)
    total = [0.0] * dimensions
    for word in re.findall(r"\w+", text.lower()):
        for i, x in enumerate(_word_vector(seed, dimensions, word)):
            total[i] += x
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return [x / norm for x in total]


@dataclass
class FakeEmbedder:
    """The running server: ``base_url`` for a provider; ``fail_after`` requests answered before
    every further one gets a 503 (None: never); ``requests`` (model, number of texts) received."""

    base_url: str
    fail_after: int | None = None
    requests: list[tuple[str, int]] = field(default_factory=list)


@contextlib.contextmanager
def running() -> Iterator[FakeEmbedder]:
    """A :class:`FakeEmbedder` on a free port of 127.0.0.1 while the block runs."""
    state = FakeEmbedder(base_url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            state.requests.append((body["model"], len(texts)))
            if state.fail_after is not None and len(state.requests) > state.fail_after:
                self._reply(503, {"error": {"message": "the fake embedder is down", "type": "server_error"}})
                return
            data = [{"object": "embedding", "index": i, "embedding": fake_embedding(body["model"], t)}
                    for i, t in enumerate(texts)]
            self._reply(200, {"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": 0, "total_tokens": 0}})

        def _reply(self, status: int, payload: dict) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
