"""Run a FakeLLMServer in its own process for benchmarks (the model is never in the
platform's process in production, and a fake one would compete for the same GIL).

``python bench/_fake_model.py <responder>``: prints the base URL on stdout, serves until
stdin closes. Responders: ``turns20`` (19 tool-call turns, then an answer, no delay) and
``slow3`` (1 s before each of 2 tool-call turns and a 50-token answer).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm.testing import Delay, FakeLLMServer, Reply, ToolCalls  # noqa: E402

ANSWER = " ".join(["token"] * 50)


def _turns_done(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def turns20(body: dict):
    n = _turns_done(body)
    return ToolCalls([("test_echo", {"text": f"turn {n}"})]) if n < 19 else Reply("All twenty turns done.")


def slow3(body: dict):
    n = _turns_done(body)
    if n < 2:
        return Delay(1.0, ToolCalls([("test_echo", {"text": str(n)})]))
    return Delay(1.0, Reply(ANSWER, chunk_size=6))


def main() -> None:
    responder = {"turns20": turns20, "slow3": slow3}[sys.argv[1]]
    with FakeLLMServer() as server:
        server.respond(responder)
        print(server.base_url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
