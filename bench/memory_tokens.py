"""Tokens long-term memory adds to a run: the recall block at the end of the system message.

A run of an agent with memory on starts with one block (memory/kind.py, appended by
sessions/runner/turn.py as ``"\\n\\n" + title + "\\n" + text``) listing its ``max_items``
memories most relevant to the user message. The block is part of the system message, so it is
sent with **every model request of the run** (each turn); nothing else changes.

Counted here for ``max_items`` = 1, 3, 5 (the default), 10 and 20, over twenty typical
memories (one sentence each; lengths printed; which ones are the most relevant does not
matter to the count, so the first ``max_items`` are taken):

- **estimate**: ``llm.tokens.estimate_text_tokens`` (characters / 4, rounded up), what the
  runner counts against the context window and budgets;
- **qwen**: the embedded chat model's own tokenizer (Qwen2.5-Coder-0.5B GGUF, llama.cpp with
  ``vocab_only``), when ``var/models/qwen2.5-coder-0.5b-instruct-q4.gguf`` is present.

Run: ``.venv/bin/python bench/memory_tokens.py`` (no database, no server; ~1 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm.tokens import estimate_text_tokens  # noqa: E402
from memory.extraction import recall_text  # noqa: E402
from memory.kind import BLOCK_TITLE  # noqa: E402

MODEL = ROOT / "var" / "models" / "qwen2.5-coder-0.5b-instruct-q4.gguf"

MEMORIES = [
    "Name is Ana Martins.",
    "Works as a nurse at the Lyon university hospital.",
    "Prefers short answers, in French.",
    "Is vegetarian.",
    "Has two cats, Miso and Tofu.",
    "Lives in Lyon with her partner.",
    "Is learning German for a move to Berlin next year.",
    "Works night shifts three times a week.",
    "Prefers metric units.",
    "Uses a Linux laptop and an Android phone.",
    "Is allergic to penicillin.",
    "Runs 10 km on Sunday mornings.",
    "Prefers step-by-step instructions with numbered lists.",
    "Her manager is called Claire.",
    "Is saving for a flat in Berlin; budget 350,000 euros.",
    "Reads crime novels, mostly Scandinavian authors.",
    "Does not drink coffee; prefers green tea.",
    "Wants reminders phrased as questions, not orders.",
    "Birthday is on 14 March.",
    "Is studying for a master's degree in public health.",
]
SIZES = (1, 3, 5, 10, 20)


def added_text(texts: list[str]) -> str:
    """What the system message gains: ``"\\n\\n" + title + "\\n" + text`` (turn.py, run_context.py)."""
    return f"\n\n{BLOCK_TITLE}\n{recall_text(texts)}"


def qwen_counter():
    """Token counter of the embedded chat model, or None when its GGUF or llama_cpp is missing."""
    if not MODEL.exists():
        return None
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(MODEL), vocab_only=True, verbose=False)
    return lambda text: len(llm.tokenize(text.encode(), add_bos=False, special=False))


def main() -> None:
    count = qwen_counter()
    mean_chars = sum(map(len, MEMORIES)) / len(MEMORIES)
    print(f"{len(MEMORIES)} memories, mean {mean_chars:.1f} characters "
          f"({min(map(len, MEMORIES))}-{max(map(len, MEMORIES))})")
    print(f"{'max_items':>9} {'chars':>6} {'estimate':>9} {'qwen':>6}   (tokens added to every model request of a run)")
    for n in SIZES:
        text = added_text(MEMORIES[:n])
        qwen = count(text) if count else None
        print(f"{n:>9} {len(text):>6} {estimate_text_tokens(text):>9} {qwen if qwen is not None else '-':>6}")
    if count is None:
        print("(qwen: no tokenizer here; run `make run` once to fetch the embedded model)")


if __name__ == "__main__":
    main()
