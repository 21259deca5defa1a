"""Run a FakeLLMServer in its own process for benchmarks (the model is never in the
platform's process in production, and a fake one would compete for the same GIL).

``python bench/_fake_model.py <responder>``: prints the base URL on stdout, serves until
stdin closes. Responders: ``turns20`` (19 tool-call turns, then an answer, no delay) and
``slow3`` (1 s before each of 2 tool-call turns and a 50-token answer, sent at once) and
``timed3`` (the same 3 turns, but every chunk is streamed 10 ms after the previous one, and
the answer's 50 tokens are one chunk each whose text is the wall-clock time it was sent,
``%.6f`` seconds since the epoch, so a client can measure token → client latency) and ``door``
(one tool-call turn, then a 20-word answer in 20 chunks 5 ms apart: the same short run behind
every entry point of ``door_overhead.py``) and ``named`` (one call of the tool the user's message
names, then a short answer).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm.testing import Delay, FakeLLMServer, Reply, ToolCalls  # noqa: E402

ANSWER = " ".join(["token"] * 50)


def _turns_done(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def turns20(body: dict):
    n = _turns_done(body)
    return ToolCalls([("test_echo", {"text": f"turn {n}"})]) if n < 19 else Reply("All twenty turns done.")


JSON_ANSWER = '{"done": true, "turns": 20, "summary": "All twenty turns done."}'


def turns20json(body: dict):
    """``turns20`` whose answer is JSON (for an agent with an output schema: ``turn_overhead.py --output-schema``)."""
    return turns20(body) if _turns_done(body) < 19 else Reply(JSON_ANSWER)


def slow3(body: dict):
    n = _turns_done(body)
    if n < 2:
        return Delay(1.0, ToolCalls([("test_echo", {"text": str(n)})]))
    return Delay(1.0, Reply(ANSWER, chunk_size=6))


DOOR_REPLY = " ".join(f"word{i}" for i in range(20))


def door(body: dict):
    if _turns_done(body) < 1:
        return ToolCalls([("test_echo", {"text": "door"})])
    return Reply(DOOR_REPLY, chunk_size=len(DOOR_REPLY) // 20 + 1, chunk_interval_seconds=0.005)


def named(body: dict):
    """One call of the tool the first user message names (``<tool> <JSON arguments>``), then a
    short answer (``approval_resume.py``: a tool that needs approval, or an MCP tool that asks)."""
    if _turns_done(body) < 1:
        first = next(m for m in body["messages"] if m["role"] == "user")
        tool, _, arguments = str(first["content"]).partition(" ")
        return ToolCalls([(tool, json.loads(arguments or "{}"))])
    return Reply("Done.")


TIME_MARK = "@T@"
"""Replaced, in every SSE payload, by the time the payload is written to the socket."""
TIMED_TOKENS = 50
TIMED_INTERVAL_SECONDS = 0.010
TIMED_TEXT = "".join(f"{TIME_MARK} " for _ in range(TIMED_TOKENS))


def timed3(body: dict):
    n = _turns_done(body)
    if n < 2:
        return Delay(1.0, ToolCalls([("test_echo", {"text": str(n)})], chunk_interval_seconds=TIMED_INTERVAL_SECONDS))
    return Delay(1.0, Reply(TIMED_TEXT, chunk_size=len(TIME_MARK) + 1, chunk_interval_seconds=TIMED_INTERVAL_SECONDS))


class TimestampingServer(FakeLLMServer):
    """Writes the send time into every payload that carries :data:`TIME_MARK`."""

    @staticmethod
    async def _stream(payloads, interval, reader, writer):
        class _Stamped(list):
            def __iter__(self):
                for payload in list.__iter__(self):
                    yield payload.replace(TIME_MARK, f"{time.time():.6f}") if TIME_MARK in payload else payload

        await FakeLLMServer._stream(_Stamped(payloads), interval, reader, writer)


SUMMARIZER_PREFIX = "You compress the history"
TOOL_TURNS = 99
SUMMARY = (
    "## Goal\n- Review the 99 modules of the code base one by one and report on them.\n"
    "## Progress\n- Modules read so far, with their notable functions and constants, are listed in the key context.\n"
    "## Decisions\n- Read every module in order; large ones in full.\n"
    "## Next steps\n- Continue with the next module.\n"
    "## Key context\n- Functions follow the f_<hash>(x) pattern; nothing unusual found so far.\n"
)


def tool100(total_turns: int = TOOL_TURNS + 1):
    """``total_turns - 1`` (default 99) tool-call turns (``bench_read_file``: 4 turns in 5 read a
    4,000-character file, the fifth a 200-character one), then an answer; summarizer requests
    get :data:`SUMMARY`. ``tools:<n>`` on the command line: ``n`` turns."""
    turns = iter(range(10**6))

    def respond(body: dict):
        if str(body["messages"][0].get("content", "")).startswith(SUMMARIZER_PREFIX):
            return Reply(SUMMARY)
        n = next(turns)
        if n < total_turns - 1:
            size = 200 if n % 5 == 4 else 4000
            return ToolCalls([("bench_read_file", {"path": f"src/module_{n:02d}.py", "size": size})],
                             text=f"Reading module {n}.")
        return Reply(f"All {total_turns - 1} modules reviewed: nothing unusual found.")

    return respond


def main() -> None:
    name = sys.argv[1]
    if name.startswith("tools:"):
        responder = tool100(int(name.split(":", 1)[1]))
    else:
        responder = {"turns20": turns20, "turns20json": turns20json, "slow3": slow3, "timed3": timed3, "door": door,
                     "named": named}.get(name) or {"tool100": tool100}[name]()
    with (TimestampingServer() if sys.argv[1] == "timed3" else FakeLLMServer()) as server:
        server.respond(responder)
        print(server.base_url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
