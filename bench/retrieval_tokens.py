"""Tokens retrieval adds to a run: ``knowledge_search``'s result, and passages given before the first turn.

The demo knowledge base's own documents (README.md and ARCHITECTURE.md, parsed and chunked as
ingestion does: Markdown sections, 500 characters with 50 of overlap, the knowledge base's
defaults) are the passages. For ``top_k`` = 1, 3, 4 (the demo's), 5 (the default) and 10,
``--samples`` (200) random sets of ``top_k`` distinct chunks (seeded) are rendered exactly as
a run sends them, and counted:

- **tool result**: :func:`knowledge.tools.passages_render` (``[n] title › heading`` + the
  passage, per hit) framed as outside data
  (:func:`sessions.runner.tool_execution.frame_untrusted`): the ``tool`` message a
  ``knowledge_search`` call adds, sent again with every later model request of the run (and of
  the chat's later runs, until compaction);
- **before the first turn** (``retrieve_before_first_turn``): the same passages as the start
  context block appended to the system message (its title + the framed passages,
  :func:`sessions.runner.run_context.context_system_text`), sent with every model request of
  the run;

each with ``llm.tokens.estimate_text_tokens`` (characters / 4, what the runner counts against
the context window and budgets) and, when ``var/models/qwen2.5-coder-0.5b-instruct-q4.gguf``
is present, the embedded chat model's own tokenizer. Mean and p95 over the samples. The
untrusted-data note in the system message (once per run, whatever ``top_k``) is counted on its
own line.

Run: ``.venv/bin/python bench/retrieval_tokens.py [--samples 200]`` (no database, no server; a few seconds).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

import django  # noqa: E402

django.setup()

from _stats import percentile  # noqa: E402
from memory_tokens import qwen_counter  # noqa: E402

from capabilities.registry import ContextBlock  # noqa: E402
from knowledge.chunking import chunk_sections  # noqa: E402
from knowledge.parsing import parse_markdown  # noqa: E402
from knowledge.tools import CITE_NOTE, CitationNumbers, passages_render  # noqa: E402
from llm.tokens import estimate_text_tokens  # noqa: E402
from sessions.runner.run_context import context_system_text  # noqa: E402
from sessions.runner.tool_execution import UNTRUSTED_SYSTEM_NOTE, frame_untrusted  # noqa: E402

DOCS = ("README.md", "ARCHITECTURE.md")
TOP_KS = (1, 3, 4, 5, 10)
TITLE = f"Passages from “Platform documentation” that may answer the user's message (use them when relevant). {CITE_NOTE}"
"""A start-context block's title as knowledge/tools.py writes it for the demo knowledge base."""


def demo_hits() -> list[SimpleNamespace]:
    """Every chunk of the demo knowledge base's documents, shaped as a search hit."""
    hits = []
    for doc_id, name in enumerate(DOCS, start=1):
        parsed = parse_markdown((ROOT / name).read_bytes())
        for position, chunk in enumerate(chunk_sections(parsed.sections, size=500, overlap=50)):
            hits.append(SimpleNamespace(
                knowledge_base_id=1, document_id=doc_id, document_title=parsed.title or name,
                chunk_id=len(hits) + 1, position=position, heading=chunk.heading, text=chunk.text, score=0.0))
    return hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    count = qwen_counter()
    hits = demo_hits()
    rng = random.Random(26)
    print(f"{len(hits)} chunks of {', '.join(DOCS)} (500/50); {args.samples} random sets per top_k; "
          f"qwen tokenizer: {'yes' if count else 'no (run make run once)'}")
    print(f"untrusted-data note in the system message (once per run): estimate "
          f"{estimate_text_tokens(UNTRUSTED_SYSTEM_NOTE)}, qwen {count(UNTRUSTED_SYSTEM_NOTE) if count else '-'}")
    print(f"{'top_k':>5} | {'tool result: estimate mean/p95':>30} | {'qwen mean/p95':>14} | "
          f"{'start context: estimate mean/p95':>32} | {'qwen mean/p95':>14}")
    for k in TOP_KS:
        rows: dict[str, list[int]] = {"tool_est": [], "tool_qwen": [], "ctx_est": [], "ctx_qwen": []}
        for _ in range(args.samples):
            picked = rng.sample(hits, k)
            text, _citations = passages_render(picked, CitationNumbers())
            tool = frame_untrusted(text)
            context = "\n\n" + context_system_text([ContextBlock(source="knowledge", title=TITLE, text=text,
                                                                 untrusted=True)])
            rows["tool_est"].append(estimate_text_tokens(tool))
            rows["ctx_est"].append(estimate_text_tokens(context))
            if count:
                rows["tool_qwen"].append(count(tool))
                rows["ctx_qwen"].append(count(context))

        def cell(name: str, rows: dict[str, list[int]] = rows) -> str:
            values = rows[name]
            return f"{sum(values) / len(values):.0f} / {percentile(values, 0.95):.0f}" if values else "-"

        print(f"{k:>5} | {cell('tool_est'):>30} | {cell('tool_qwen'):>14} | {cell('ctx_est'):>32} | {cell('ctx_qwen'):>14}")


if __name__ == "__main__":
    main()
