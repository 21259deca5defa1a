"""Calibrate the platform's attribution threshold (knowledge.attribution.ATTRIBUTION_THRESHOLD).

When a run's answer cites none of the passages it was given, the platform attributes each of
its sentences to the given passage whose stored chunk vector is nearest (cosine ≥ the
threshold). This measures, with the embedded all-MiniLM-L6-v2 (scripts/llm_server.py,
``LLM_ROLE=embeddings``, the same model and pooling as the knowledge bases' vectors), the best
cosine of

- **restated** sentences: one hand-written answer sentence per question of
  bench/knowledge_quality.py (40), restating the passage that answers it in other words, as an
  assistant would;
- **verbatim** sentences: the document's own sentence holding the question's excerpt;
- **unrelated** sentences: (a) every other question's restated sentence, against this
  question's passages when none of them is that sentence's own passage (a sentence about
  something else in the same documentation), and (b) filler and off-topic sentences
  (:data:`OFF_TOPIC`), against every question's passages;

against the passages a run would be given: README.md and ARCHITECTURE.md chunked as a
knowledge base does (500 characters, 50 of overlap, heading path embedded with the text), the
five chunks nearest to the question (vector only: the hybrid retrieval's lists need the
database; its top five differ, the comparison per sentence does not). A restated sentence is
**right** when its best passage is the one holding the question's excerpt.

Prints the distributions and, per threshold, the share of restated / verbatim sentences
attributed to the right passage, attributed to a wrong one, and of unrelated sentences
attributed at all. No database, no Django models (only the pure chunker and sentence
splitter).

``--answers N``: also the embedded chat model (Qwen2.5-Coder-0.5B, scripts/llm_server.py, a
server of its own, temperature 0) answers the first N questions whose passage was given, from
the 5 passages numbered [1]..[5] with the Docs assistant's instruction to cite them; printed:
how many answers cite, how many uncited ones get an attribution at the chosen threshold
(:data:`knowledge.attribution.ATTRIBUTION_THRESHOLD`), how many of those name the passage
holding the answer, and the time to embed an answer's sentences::

    .venv/bin/python bench/attribution_threshold.py
    .venv/bin/python bench/attribution_threshold.py --answers 20
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))



def _questions() -> list[tuple[str, list[str]]]:
    """``QUESTIONS + ADDED_QUESTIONS`` of bench/knowledge_quality.py, read without importing it (its
    import sets Django up on the development database, which this bench does not need)."""
    import ast

    tree = ast.parse((ROOT / "bench" / "knowledge_quality.py").read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = ast.literal_eval(node.value)
    return found["QUESTIONS"] + found["ADDED_QUESTIONS"]


RESTATED: list[str] = [
    # QUESTIONS (26)
    "Every tenant-owned table carries a tenant_isolation policy, so a row is only visible when its tenant id is "
    "among the tenant ids set for the connection.",
    "All of the application's statements are executed as the agent_platform_app role, which cannot log in and "
    "does not bypass row-level security.",
    "If the worker dies, the run is delivered again and picks up from its last saved step; tool calls that "
    "already have a result are not executed again.",
    "A heartbeat task next to the loop updates the run's heartbeat timestamp every few seconds.",
    "The sweeper gives stale runs to another worker, and after too many attempts marks them failed with "
    "worker_lost.",
    "An Approval row is created, the call waits for approval, and the run pauses without holding a worker.",
    "Streamed text is sent right away for the first piece and then at most once every 25 milliseconds per run.",
    "MCP sessions live in a pool per event loop, with one pooled session per tenant, server and configuration.",
    "web_fetch may only connect to public addresses, and it dials exactly the IPs it has validated.",
    "Each tenant's secrets use a random Fernet data key, which is itself wrapped by the master key from "
    "ENCRYPTION_KEY.",
    "Compaction summarizes the older messages with the route's own model and keeps only the last few as they are.",
    "A single pure function classifies each failure; transient errors are retried and bad requests are returned.",
    "For each entry the breaker keeps a sliding one-minute window of calls and failures plus a cooldown in Redis.",
    "Each element of the template turns into exactly one argument of the process, and no shell is involved.",
    "Calling a skill creates a sub-run that runs the same loop inside the parent's tool call.",
    "You write one module with a CapabilityKind subclass and register it with kind_register in your app's ready().",
    "A Lua script increments the session counter, appends the event to the Redis stream and publishes it.",
    "After each action the page script sends back a diff of the list of elements.",
    "It freezes the heap because a full garbage collection over 200 runs used to block the loop for about 150 ms.",
    "The run host's async pool holds 8 PostgreSQL connections by default (RUN_HOST_PG_CONNECTIONS).",
    "Use make run to set everything up and start the platform, and make test to run the whole test suite.",
    "The local database is PostgreSQL 18 with pgvector 0.8.6.",
    "Open the extension's options, type in the platform's URL and a browser name, then click Pair this browser.",
    "They are written once to var/secrets.env, a file with mode 0600 that git ignores.",
    "After 10 failed logins for one username from one address the pair is locked out for 15 minutes.",
    "The unpacked extension's id is mbcfbjmfgndlpbhnffdhmbecjdjpeeok, fixed by the key in manifest.json.",
    # ADDED_QUESTIONS (14)
    "An MCP server can run as a stdio program from the operator's catalogue or be reached remotely over HTTP.",
    "A CLI command is killed together with all its child processes after its timeout, 30 seconds by default.",
    "web_read returns at most 15,000 characters by default, and never more than 40,000.",
    "A skill is a SKILL.md file: YAML front matter followed by Markdown instructions.",
    "Memories are extracted once a chat has been idle for the configured number of minutes, or when the user "
    "asks to remember the chat.",
    "Yes, users can see and delete the agent's memories about them in the chat app's Memory dialog.",
    "No: a sandboxed program that ignores the proxy settings has no network access at all.",
    "The audit log records every admin write made from the console or the admin API, and failed logins.",
    "Such models write their tool calls as text, the tools are described in the system prompt and the calls are "
    "parsed from the answer.",
    "A throttled caller gets an HTTP 429 response with a Retry-After header.",
    "Keeping vectors in PostgreSQL keeps both the index and the tenant boundary, which a separate vector store "
    "would lose.",
    "Documents are chunked recursively by headings, paragraphs and sentences into 500-character chunks with "
    "50 characters of overlap.",
    "Compaction is tried at most three times per turn, so it cannot loop.",
    "Because PostgreSQL only uses an index for leakproof operators under row-level security, the lexical "
    "search runs in a SECURITY DEFINER function.",
]
"""One restating answer sentence per question of ``QUESTIONS + ADDED_QUESTIONS``, in order (written
for this bench from the passages; not the documents' wording)."""

OFF_TOPIC: list[str] = [
    "I hope this helps!",
    "Let me know if you have any other questions about the platform.",
    "Here is a summary of what I found in the documentation.",
    "The Eiffel Tower is 330 metres tall and was finished in 1889.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "To bake bread, knead the dough for ten minutes and let it rise for an hour.",
    "The capital of Australia is Canberra, not Sydney.",
    "Python lists are ordered and mutable, while tuples cannot be changed.",
    "A binary search halves the search interval at every step.",
    "JavaScript promises represent a value that may be available later.",
    "The stock market closed higher today after a volatile session.",
    "Regular exercise and enough sleep improve concentration.",
]
"""Sentences about something else than any passage (filler an assistant writes, and other topics)."""

THRESHOLDS = [round(0.30 + 0.05 * i, 2) for i in range(12)]


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _chunks() -> list[tuple[str, str]]:
    """``[(embedded text, chunk text)]`` of README.md, ARCHITECTURE.md and docs/*.md, chunked as a knowledge base does."""
    from knowledge.chunking import chunk_index_text, chunk_sections
    from knowledge.parsing import parse_markdown

    out = []
    names = ("README.md", "ARCHITECTURE.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
    for name in names:  # the demo knowledge base's files (seed_demo.DOCS_FILES)
        parsed = parse_markdown((ROOT / name).read_bytes())
        for draft in chunk_sections(parsed.sections, size=500, overlap=50):
            out.append((chunk_index_text(draft.heading, draft.text), draft.text))
    return out


def _embedder():
    """Start the embedded embedder on a free port; ``(process, embed(texts) -> unit vectors)``."""
    import socket

    import httpx
    import llm_server
    import numpy as np
    import setup_embedder

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LLM_ROLE": "embeddings", "EMBEDDINGS_PORT": str(port), "EMBEDDINGS_HOST": "127.0.0.1",
           "EMBEDDINGS_MODEL_PATH": str(setup_embedder.ensure_embedder()), "LLM_VERBOSE": "false"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    if not llm_server.wait_ready(url, timeout_seconds=120):
        proc.terminate()
        raise RuntimeError("the embeddings server did not start")

    def embed(texts: list[str]):
        vectors = []
        for start in range(0, len(texts), 32):
            reply = httpx.post(f"{url}/embeddings", timeout=120,
                               json={"model": "all-minilm-l6-v2", "input": texts[start:start + 32]})
            reply.raise_for_status()
            vectors += [d["embedding"] for d in sorted(reply.json()["data"], key=lambda d: d["index"])]
        matrix = np.asarray(vectors, dtype=np.float64)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)  # llm.embeddings normalises the same way

    return proc, embed


def _percentiles(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "-"
    p = np.percentile(values, [0, 10, 50, 90, 100])
    return " / ".join(f"{v:.3f}" for v in p)


ANSWER_PROMPT = (
    "You answer questions about the Agent Platform from its documentation. Answer in two to four sentences "
    "using only the passages below, and cite each passage you use by its number in square brackets, like [1]. "
    "If the passages do not answer the question, say so."
)
"""The Docs assistant's instruction (console/management/commands/seed_demo.py), for a prompt
that carries the passages itself instead of a knowledge_search call."""


def _chat_model():
    """Start the embedded chat model on a free port; ``(process, ask(system, user) -> text)``."""
    import socket

    import httpx
    import llm_server
    import setup_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LLM_PORT": str(port), "LLM_HOST": "127.0.0.1", "LLM_VERBOSE": "false",
           "LLM_MODEL_PATH": str(setup_model.ensure_model())}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    if not llm_server.wait_ready(f"http://127.0.0.1:{port}/v1", timeout_seconds=180):
        proc.terminate()
        raise RuntimeError("the chat model server did not start")

    def ask(system: str, user: str) -> str:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300, json={
            "model": "local", "temperature": 0, "max_tokens": 200,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"] or ""

    return proc, ask


def _answers(count: int, rows, given, chunks, chunk_vecs, embed) -> None:
    """The 0.5B model's answers to ``count`` questions, attributed as the platform does."""
    import numpy as np

    from knowledge.attribution import ATTRIBUTION_THRESHOLD, answer_sentences, best_passages, cites_any

    proc, ask = _chat_model()
    cited = uncited = attributed = right = sentences_total = sentences_attributed = 0
    embed_ms: list[float] = []
    try:
        picked = [i for i, r in enumerate(rows) if set(given[i]) & set(r[2])][:count]
        for i in picked:
            passages = "\n\n".join(f"[{k + 1}] {chunks[c][0]}" for k, c in enumerate(given[i]))
            answer = ask(ANSWER_PROMPT, f"Passages:\n\n{passages}\n\nQuestion: {rows[i][1]}")
            if cites_any(answer, range(1, 6)):
                cited += 1
                continue
            uncited += 1
            sentences = answer_sentences(answer)
            if not sentences:
                continue
            started = time.perf_counter()
            vectors = embed([s.text for s in sentences])
            embed_ms.append((time.perf_counter() - started) * 1000)
            matches = best_passages([list(v) for v in vectors],
                                    [(int(c), list(chunk_vecs[c])) for c in given[i]], threshold=ATTRIBUTION_THRESHOLD)
            sentences_total += len(sentences)
            found = [m for m in matches if m is not None]
            sentences_attributed += len(found)
            if found:
                attributed += 1
                right += any(m[0] in rows[i][2] for m in found)
            print(f"  - {rows[i][1]}\n    answer: {answer.strip()[:300]!r}\n    attributed: "
                  f"{[(given[i].index(m[0]) + 1, round(m[1], 3)) for m in found]}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(f"\n0.5B answers to {len(picked)} questions (threshold {ATTRIBUTION_THRESHOLD}): {cited} cite a passage, "
          f"{uncited} cite none; of these {attributed} get at least one attribution, {right} of them to the "
          f"passage holding the answer; {sentences_attributed} of their {sentences_total} sentences attributed; "
          f"embedding an answer's sentences took median {np.median(embed_ms) if embed_ms else 0:.0f} ms "
          f"(max {max(embed_ms, default=0):.0f} ms)")


def main() -> int:
    import argparse

    import numpy as np

    from knowledge.attribution import answer_sentences

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=0, help="also attribute N answers of the 0.5B chat model")
    args = parser.parse_args()

    questions = _questions()
    if len(RESTATED) != len(questions):
        raise SystemExit(f"{len(RESTATED)} restated sentences for {len(questions)} questions")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    chunks = _chunks()
    proc, embed = _embedder()
    started = time.perf_counter()
    try:
        chunk_vecs = embed([c[0] for c in chunks])
        rows = []  # (question index, given chunk indices, relevant chunk index, restated, verbatim)
        for qi, (question, excerpts) in enumerate(questions):
            excerpt = _norm(excerpts[0])
            holding = [i for i, (_, text) in enumerate(chunks) if excerpt in _norm(text)]
            if not holding:
                print(f"skipped (its passage is no longer in the documents): {question}")
                continue
            sentences = [s for s in answer_sentences(" ".join(_norm(chunks[holding[0]][1]).split()))
                         if excerpt[:40] in _norm(s.text)]
            verbatim = sentences[0].text if sentences else excerpt
            rows.append((qi, question, holding, RESTATED[qi], verbatim))
        q_vecs = embed([r[1] for r in rows])
        restated_vecs = embed([r[3] for r in rows])
        verbatim_vecs = embed([r[4] for r in rows])
        off_vecs = embed(OFF_TOPIC)
        given = [list(np.argsort(-(chunk_vecs @ q_vecs[i]))[:5]) for i in range(len(rows))]
        recall = sum(1 for i, r in enumerate(rows) if set(given[i]) & set(r[2])) / len(rows)
        print(f"{len(chunks)} chunks, {len(rows)} questions; the excerpt's chunk is among the 5 given for "
              f"{recall:.0%} of them (questions where it is not count only as unrelated material)")

        def best(vec, chunk_ids):
            scores = chunk_vecs[chunk_ids] @ vec
            k = int(np.argmax(scores))
            return float(scores[k]), chunk_ids[k]

        positives: dict[str, list[tuple[float, bool]]] = {"restated": [], "verbatim": []}
        for i, r in enumerate(rows):
            if not set(given[i]) & set(r[2]):
                continue
            for name, vecs in (("restated", restated_vecs), ("verbatim", verbatim_vecs)):
                score, chunk = best(vecs[i], given[i])
                positives[name].append((score, chunk in r[2]))
        unrelated: dict[str, list[float]] = {"other question's answer": [], "filler / off-topic": []}
        for i in range(len(rows)):
            for j, other in enumerate(rows):
                if j != i and not set(given[i]) & set(other[2]):
                    unrelated["other question's answer"].append(best(restated_vecs[j], given[i])[0])
            for k in range(len(OFF_TOPIC)):
                unrelated["filler / off-topic"].append(best(off_vecs[k], given[i])[0])
        print(f"embedding and scoring took {time.perf_counter() - started:.1f} s\n")
        print("best cosine against the 5 given passages: min / p10 / median / p90 / max")
        for name, pairs in positives.items():
            print(f"- {name} (n={len(pairs)}, best passage right for {sum(ok for _, ok in pairs)}): "
                  f"{_percentiles([s for s, _ in pairs])}")
        for name, scores in unrelated.items():
            print(f"- unrelated: {name} (n={len(scores)}): {_percentiles(scores)}")
        print("\n| threshold | restated → right passage | restated → wrong passage | verbatim → right | "
              "unrelated (other answers) attributed | unrelated (filler/off-topic) attributed |")
        print("|---:|---:|---:|---:|---:|---:|")
        for t in THRESHOLDS:
            rs = positives["restated"]
            vb = positives["verbatim"]
            cells = [
                f"{sum(1 for s, ok in rs if s >= t and ok) / len(rs):.0%}",
                f"{sum(1 for s, ok in rs if s >= t and not ok) / len(rs):.0%}",
                f"{sum(1 for s, ok in vb if s >= t and ok) / len(vb):.0%}",
                *(f"{sum(1 for s in v if s >= t) / len(v):.1%}" for v in unrelated.values()),
            ]
            print(f"| {t:.2f} | " + " | ".join(cells) + " |")
        if args.answers:
            _answers(args.answers, rows, given, chunks, chunk_vecs, embed)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
