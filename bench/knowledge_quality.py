"""Retrieval quality on questions written for this project's own README.md and ARCHITECTURE.md.

The set is ours (no public question-answering set was used): questions written by hand for
the two documents, each with the passage(s) that answer it, given as a short exact excerpt of
the document (whitespace-normalised). ``QUESTIONS`` are the first 26, against which the
retrieval was developed; ``ADDED_QUESTIONS`` (14) were written afterwards, before any method
was run on them, and are reported on their own as well (a held-out check that a change did
not just fit the first 26). Both documents are ingested through the real pipeline
(Markdown sections, chunks of 500 characters with 50 of overlap unless ``--chunk`` says
otherwise, the embedded all-MiniLM-L6-v2); a hit is relevant when its text contains one of the question's excerpts.
For each method, **recall@5** (questions with a relevant hit among the first five) and **MRR**
(mean of 1/rank of the first relevant hit in the first ten, 0 when none):

- vector only, lexical only, hybrid (RRF of both), and, with ``--rerank``, hybrid + rerank:
  the fused top ten reordered by one listwise call per question (knowledge.rerank,
  RankGPT's prompt) to the embedded chat model (Qwen2.5-Coder-0.5B, scripts/llm_server.py);
  with ``--pointwise`` also the pointwise reranker (one 0–10 grade per passage, ten calls per
  question). The 0.5B model is a weak judge: the figures say what rerank with the default
  model gives, not what a capable model would. With ``--rerank-url`` and ``--rerank-model``,
  also hybrid + a rerank model (a cross-encoder behind ``/v1/rerank``, llm.embeddings.rerank;
  key from ``RERANK_API_KEY``), e.g. llama.cpp's ``llama-server --reranking`` with a
  bge-reranker GGUF, or Jina's or Cohere's API. None ships with the platform.

An excerpt that is no longer in the documents (they are edited) is reported and its question
skipped.

    .venv/bin/python bench/knowledge_quality.py
    .venv/bin/python bench/knowledge_quality.py --rerank
    .venv/bin/python bench/knowledge_quality.py --rerank-url http://127.0.0.1:8083/v1 --rerank-model bge-reranker-v2-m3
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
DOCUMENTS = ("README.md", "ARCHITECTURE.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
"""The demo knowledge base's files (console/management/commands/seed_demo.py, DOCS_FILES): the
README's former sections are in docs/ now."""

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

ADDED_QUESTIONS: list[tuple[str, list[str]]] = [
    # README.md
    ("Which transports can an MCP server use?", ["`stdio`: a program of the operator catalogue"]),
    ("How long may a CLI command run before it is killed?",
     ["the command and every process it started are killed after this"]),
    ("How much text does web_read return at most?", ["cut at `max_chars` (default 15,000, at most 40,000)"]),
    ("In what format is a skill written?", ["It is written as a `SKILL.md`"]),
    ("When does the agent extract memories from a chat?", ["has had no message for `extract_after_idle_minutes`"]),
    ("Can users delete what an agent remembers about them?", ["Users see and delete what an agent remembers"]),
    ("Can a sandboxed program reach the network without the egress proxy?",
     ["Programs that ignore the proxy variables have no network at all"]),
    ("What does the audit log record?", ["every admin write from the console"]),
    ("How are tool calls handled for models that cannot call tools natively?", ["write tool calls as text"]),
    ("What does a throttled API caller receive?", ["a throttled caller gets 429 with `Retry-After`"]),
    # ARCHITECTURE.md
    ("Why are vectors stored in PostgreSQL rather than a separate vector database?",
     ["a second store (a vector database beside PostgreSQL)"]),
    ("How are documents split into chunks?", ["The chunker is recursive"]),
    ("How many times is compaction attempted in one turn?", ["Attempts are counted per turn"]),
    ("Why does full-text search go through a SECURITY DEFINER function?",
     ["uses an index only for leakproof"]),
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


def _chat_reranker(port: int, *, listwise: bool):
    """An LLM reranker (listwise: one call per question; else pointwise: one per passage) on
    the embedded chat model at 127.0.0.1:``port`` (OpenAI-compatible), temperature 0."""
    import httpx

    from knowledge.rerank import LISTWISE_MAX_OUTPUT_TOKENS, RERANK_MAX_OUTPUT_TOKENS, listwise_reranker, llm_reranker

    def complete(prompt: str) -> str:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
            "model": "local", "temperature": 0,
            "max_tokens": LISTWISE_MAX_OUTPUT_TOKENS if listwise else RERANK_MAX_OUTPUT_TOKENS,
            "messages": [{"role": "user", "content": prompt}]})
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"] or ""

    return listwise_reranker(complete) if listwise else llm_reranker(complete)


def _model_reranker(base_url: str, model: str):
    """A rerank model at ``base_url`` (``/v1/rerank``), reached whatever its address."""
    from urllib.parse import urlsplit

    from django.conf import settings

    from knowledge.rerank import MAX_PASSAGE_CHARS
    from llm.embeddings import EmbeddingEndpoint, rerank

    host = urlsplit(base_url)
    port = host.port or (443 if host.scheme == "https" else 80)
    settings.OUTBOUND_ALLOWED_HOSTS = [*settings.OUTBOUND_ALLOWED_HOSTS, f"{host.hostname}:{port}"]
    endpoint = EmbeddingEndpoint(name="bench reranker", base_url=base_url, api_key=os.environ.get("RERANK_API_KEY", ""))
    return lambda query, passages: rerank(endpoint, model, query, [p[:MAX_PASSAGE_CHARS] for p in passages])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rerank", action="store_true", help="also hybrid + listwise rerank on the embedded chat model")
    parser.add_argument("--pointwise", action="store_true", help="also hybrid + pointwise rerank (ten calls a question)")
    parser.add_argument("--rerank-url", help="also hybrid + the rerank model at this /v1 base URL")
    parser.add_argument("--rerank-model", help="the rerank model's name at --rerank-url")
    parser.add_argument("--chunk", default="500:50", metavar="SIZE:OVERLAP",
                        help="the knowledge base's chunk size and overlap in characters (default 500:50)")
    args = parser.parse_args()
    chunk_size, chunk_overlap = (int(n) for n in args.chunk.split(":", 1))
    if bool(args.rerank_url) != bool(args.rerank_model):
        parser.error("--rerank-url and --rerank-model go together")
    docs = {name: (ROOT / name).read_text(encoding="utf-8") for name in DOCUMENTS}
    corpus = _norm(" ".join(docs.values()))
    questions = []
    for number, (question, excerpts) in enumerate(QUESTIONS + ADDED_QUESTIONS):
        present = [e for e in excerpts if _norm(e) in corpus]
        if present:
            questions.append((question, present, "first 26" if number < len(QUESTIONS) else "added 14"))
        else:
            print(f"skipped (its passage is no longer in the documents): {question}")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; {len(questions)} questions")
    import knowledge.tasks
    from knowledge.ingestion import document_ingest
    from knowledge.services import document_add_text

    knowledge.tasks.document_ingest_enqueue = lambda **kwargs: None  # ingested below, synchronously
    with knowledge_common.embedder() as url, knowledge_common.throwaway_tenants(1) as (tenant,):
        kb = KnowledgeBase.all_tenants.create(
            tenant=tenant, name="docs", embedding_provider=knowledge_common.embedding_provider(tenant, url),
            embedding_model="all-minilm-l6-v2", dimensions=384, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        with tenant_scope(tenant.pk):
            for name, text in docs.items():
                added = document_add_text(knowledge_base=kb, title=name, text=text)
                assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
        methods = {"vector only": {"lists": ("vector",)}, "lexical only": {"lists": ("lexical",)}, "hybrid": {}}
        if args.rerank_url:
            methods[f"hybrid + rerank model ({args.rerank_model})"] = {
                "rerank": _model_reranker(args.rerank_url, args.rerank_model), "rerank_candidates": 10}
        chat = None
        if args.rerank or args.pointwise:
            import llm_server
            import setup_model

            port = knowledge_common.free_port()
            env = {**os.environ, "LLM_PORT": str(port), "LLM_HOST": "127.0.0.1", "LLM_VERBOSE": "false",
                   "LLM_MODEL_PATH": str(setup_model.ensure_model())}
            chat = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            if not llm_server.wait_ready(f"http://127.0.0.1:{port}/v1", timeout_seconds=180):
                raise RuntimeError("the chat model server did not start")
            if args.rerank:
                methods["hybrid + listwise rerank (0.5B)"] = {
                    "rerank": _chat_reranker(port, listwise=True), "rerank_candidates": 10}
            if args.pointwise:
                methods["hybrid + pointwise rerank (0.5B)"] = {
                    "rerank": _chat_reranker(port, listwise=False), "rerank_candidates": 10}
        try:
            sets = ("first 26", "added 14", "all")
            print("| method | " + " | ".join(f"recall@5 {n} | MRR {n}" for n in sets) + " | s/question |")
            print("|---|" + "---:|" * (2 * len(sets) + 1))
            for name, options in methods.items():
                ranks: dict[str, list[int | None]] = {n: [] for n in sets}
                started = time.perf_counter()
                for question, excerpts, which in questions:
                    hits = search(tenant_id=tenant.pk, knowledge_base_ids=[kb.pk], query=question, top_k=10,
                                  **options)
                    ranks[which].append(_rank(hits, excerpts))
                    ranks["all"].append(ranks[which][-1])
                cells = []
                for n in sets:
                    got = ranks[n] or [None]
                    cells.append(f"{sum(1 for r in got if r is not None and r <= 5) / len(got):.3f}")
                    cells.append(f"{sum(1 / r for r in got if r is not None) / len(got):.3f}")
                seconds = (time.perf_counter() - started) / len(questions)
                print(f"| {name} | " + " | ".join(cells) + f" | {seconds:.2f} |", flush=True)
        finally:
            if chat is not None:
                chat.terminate()
                chat.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
