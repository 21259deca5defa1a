"""Retrieval quality on questions written for this project's own README.md and ARCHITECTURE.md.

The set is ours (no public question-answering set was used): 26 questions written by hand for
the two documents, each with the passage(s) that answer it, given as a short exact excerpt of
the document (whitespace-normalised). Both documents are ingested through the real pipeline
(Markdown sections, chunks of 500 characters with 50 of overlap, the embedded
all-MiniLM-L6-v2); a hit is relevant when its text contains one of the question's excerpts.
For each method, **recall@5** (questions with a relevant hit among the first five) and **MRR**
(mean of 1/rank of the first relevant hit in the first ten, 0 when none):

- vector only, lexical only, hybrid (RRF of both), and, with ``--rerank``, hybrid + rerank:
  an LLM as a pointwise reranker (knowledge.rerank) over the fused top ten, on the embedded
  chat model (Qwen2.5-Coder-0.5B, scripts/llm_server.py), a weak judge: the figure says what
  rerank with the default model gives, not what a capable model would.

An excerpt that is no longer in the documents (they are edited) is reported and its question
skipped.

    .venv/bin/python bench/knowledge_quality.py
    .venv/bin/python bench/knowledge_quality.py --rerank
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import knowledge_common  # noqa: E402

from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.retrieval import search  # noqa: E402
from tenants.scoping import tenant_scope  # noqa: E402

ROOT = knowledge_common.ROOT

QUESTIONS: list[tuple[str, list[str]]] = [
    # ARCHITECTURE.md
    ("How does the database make sure one tenant cannot read another tenant's rows?",
     ["has one policy, `tenant_isolation`", "PostgreSQL holds every statement to the same context"]),
    ("Which database role do the application's statements run as?", ["every statement runs as `DATABASE_APP_ROLE`"]),
    ("What happens to a run when the worker executing it dies?", ["A run redelivered after its worker died"]),
    ("How often is a run's heartbeat written?", ["writes `Run.heartbeat_at` every few seconds"]),
    ("What does the sweeper do with stale runs?", ["The sweeper (`sessions.services.runs_sweep`"]),
    ("What happens when a tool call needs a human's approval?", ["writes an `Approval` row and leaves"]),
    ("How often is streamed model text published?", ["at most one event per 25 ms"]),
    ("Where are MCP client sessions kept and how are they shared?", ["keeps one pool per event loop"]),
    ("Which addresses is web_fetch allowed to connect to?", ["every address must be public"]),
    ("How are tenants' secrets encrypted?", ["Secrets are envelope-encrypted"]),
    ("How does compaction shorten a long conversation?", ["summarizes all but the last few with the route"]),
    ("How does the router decide whether a provider failure is retried?",
     ["Failures are classified by one pure function"]),
    ("What state does the circuit breaker keep in Redis?", ["a one-minute sliding window of calls and failures"]),
    ("How is a CLI command template turned into a process's arguments?",
     ["each template element becomes exactly one argv element"]),
    ("How is a skill executed when the model calls it?", ["a bound skill is a `SkillTool`"]),
    ("What do I write to add a new capability kind?", ["each kind is one module with a `CapabilityKind` subclass"]),
    ("How is an event published to the session's Redis stream?", ["publishes a frame with one Redis Lua script"]),
    ("What does the page script return after every browser action?", ["returns a diff of the element list"]),
    ("Why does the run host freeze the garbage collector's heap?", ["freezes the heap"]),
    ("How many PostgreSQL connections does the run host's async pool hold?", ["RUN_HOST_PG_CONNECTIONS"]),
    # README.md
    ("Which commands set up and start the platform, and run the tests?", ["make run     # set up everything"]),
    ("Which PostgreSQL version and pgvector does the local database use?",
     ["PostgreSQL 18 with pgvector 0.8.6"]),
    ("How do I pair my Chrome browser with the platform?", ["enter the platform URL", "Pair this browser"]),
    ("Where are SECRET_KEY and ENCRYPTION_KEY stored on a developer machine?",
     ["writes them once into `var/secrets.env`"]),
    ("How many failed logins lock an account out, and for how long?", ["`LOGIN_LOCKOUT_FAILURES` (10)"]),
    ("What is the extension id of the unpacked Chrome extension?", ["mbcfbjmfgndlpbhnffdhmbecjdjpeeok"]),
]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _rank(hits, excerpts: list[str]) -> int | None:
    wanted = [_norm(e) for e in excerpts]
    for rank, hit in enumerate(hits, start=1):
        text = _norm(hit.text)
        if any(w in text for w in wanted):
            return rank
    return None


def _chat_reranker(port: int):
    """An LLM reranker on the embedded chat model at 127.0.0.1:``port`` (OpenAI-compatible)."""
    import httpx

    from knowledge.rerank import RERANK_MAX_OUTPUT_TOKENS, llm_reranker

    def complete(prompt: str) -> str:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": "local", "temperature": 0, "max_tokens": RERANK_MAX_OUTPUT_TOKENS,
            "messages": [{"role": "user", "content": prompt}]})
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"] or ""

    return llm_reranker(complete)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rerank", action="store_true", help="also hybrid + rerank on the embedded chat model")
    args = parser.parse_args()
    docs = {name: (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "ARCHITECTURE.md")}
    corpus = _norm(" ".join(docs.values()))
    questions = []
    for question, excerpts in QUESTIONS:
        present = [e for e in excerpts if _norm(e) in corpus]
        if present:
            questions.append((question, present))
        else:
            print(f"skipped (its passage is no longer in the documents): {question}")
    print(f"load {os.getloadavg()[0]:.2f}; {len(questions)} questions")
    import knowledge.tasks
    from knowledge.services import document_add_text, document_ingest

    knowledge.tasks.document_ingest_enqueue = lambda **kwargs: None  # ingested below, synchronously
    with knowledge_common.embedder() as url, knowledge_common.throwaway_tenants(1) as (tenant,):
        kb = KnowledgeBase.all_tenants.create(
            tenant=tenant, name="docs", embedding_provider=knowledge_common.embedding_provider(tenant, url),
            embedding_model="all-minilm-l6-v2", dimensions=384)
        with tenant_scope(tenant.pk):
            for name, text in docs.items():
                added = document_add_text(knowledge_base=kb, title=name, text=text)
                assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
        methods = {"vector only": {"lists": ("vector",)}, "lexical only": {"lists": ("lexical",)}, "hybrid": {}}
        chat = None
        if args.rerank:
            import llm_server
            import setup_model

            port = knowledge_common.free_port()
            env = {**os.environ, "LLM_PORT": str(port), "LLM_HOST": "127.0.0.1", "LLM_VERBOSE": "false",
                   "LLM_MODEL_PATH": str(setup_model.ensure_model())}
            chat = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            if not llm_server.wait_ready(f"http://127.0.0.1:{port}/v1", timeout_seconds=180):
                raise RuntimeError("the chat model server did not start")
            methods["hybrid + rerank (Qwen2.5-Coder-0.5B)"] = {"rerank": _chat_reranker(port), "rerank_candidates": 10}
        try:
            print(f"{'method':40} recall@5   MRR@10   seconds")
            for name, options in methods.items():
                ranks = []
                started = time.perf_counter()
                for question, excerpts in questions:
                    hits = search(tenant_id=tenant.pk, knowledge_base_ids=[kb.pk], query=question, top_k=10,
                                  **options)
                    ranks.append(_rank(hits, excerpts))
                recall = sum(1 for r in ranks if r is not None and r <= 5) / len(ranks)
                mrr = sum(1 / r for r in ranks if r is not None) / len(ranks)
                print(f"{name:40} {recall:8.3f} {mrr:8.3f} {time.perf_counter() - started:9.1f}", flush=True)
        finally:
            if chat is not None:
                chat.terminate()
                chat.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
