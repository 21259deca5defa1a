"""Retrieval alone with each candidate embedding model, on the shipped Docs QA dataset (issue 38).

For each embedding model: a throwaway tenant, a knowledge base on that model (384 dimensions,
so the stored vectors' column fits), the demo knowledge base's files
(``seed_demo.DOCS_FILES``) ingested through the real pipeline exactly as ``seed_demo`` adds
them (Markdown sections, 500-character chunks), then for each of the 42 Docs QA questions
(``evaluation/datasets/docs_qa.jsonl``) the platform's hybrid search (``knowledge.retrieval.search``,
its defaults) with the question's own words, as a Docs assistant run does before its first
turn. A question **hits at k** when one of the first k passages (document title, heading and
text, as the run is given them) holds every expected fact (``evaluation.scorers.normalise``,
word boundaries, as the ``facts`` scorer matches). Reported: hits at 4 / 6 / 8 / 10 (the Docs
assistant's ``top_k`` is 4), the questions missed at 4, the same for the vector list alone
(the embedder's own part of the fusion), and the ingestion time.

Each query is embedded by the caller (``search(query_vector=...)``), so a model that wants a
query instruction (bge: ``"Represent this sentence for searching relevant passages: "``; e5:
``"query: "``) can be measured with and without it while the lexical list still reads the
question's own words. Passages are embedded as the platform embeds them (the knowledge base's
model name, no prefix added by the platform).

Embedders:

* ``--shipped``: the embedded all-MiniLM-L6-v2 (llama.cpp, ``scripts/llm_server.py``, one
  thread), started and stopped here;
* ``--embedder JSON`` (repeatable): a server already running, e.g.
  ``{"label": "e5-small", "url": "http://127.0.0.1:8092/v1", "model": "e5-passage",
  "queries": {"query: prefix": {"model": "e5-query"}, "no query prefix": {"model": "e5-passage"}}}``;
  each entry of ``queries`` is ``{"model": name, "prefix": text}`` (both optional: the
  passages' model, no prefix); ``"dimensions"`` (optional, default 384) is the length of the
  model's vectors (the knowledge base's ``dimensions``: 384, 768, 1024 and 1536 have an index).

    DATABASE_URL=... nice -n 10 .venv/bin/python bench/embedder_retrieval.py --shipped \\
        --embedder '{...}' --label embedders

Writes ``bench/results/model_accuracy/<date>-<label>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import knowledge_common  # noqa: E402  (Django set up, system scope entered)

from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.retrieval import Hit, search  # noqa: E402
from tenants.scoping import tenant_scope  # noqa: E402

ROOT = knowledge_common.ROOT
OUT_DIR = ROOT / "bench" / "results" / "model_accuracy"
DATASET = ROOT / "evaluation" / "datasets" / "docs_qa.jsonl"
CUTOFFS = (4, 6, 8, 10)
"""The first k passages counted; the Docs assistant is given 4 (seed_demo's ``top_k``)."""
DIMENSIONS = 384


def questions() -> list[tuple[str, list]]:
    """The Docs QA dataset's ``(question, expected facts)``, in file order."""
    rows = [json.loads(line) for line in DATASET.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(r["input"], list(r["expected"]["facts"])) for r in rows]


def passage(hit: Hit) -> str:
    """A hit as the run is given it: the document's title, the heading, the text."""
    return f"{hit.document_title} > {hit.heading}\n{hit.text}" if hit.heading else f"{hit.document_title}\n{hit.text}"


def first_rank(hits: list[Hit], facts: list) -> int | None:
    """1-based rank of the first hit holding every fact (normalised, on word boundaries; a fact
    given as alternatives, any of them), or None."""
    from evaluation.scorers import fact_in, normalise

    for rank, hit in enumerate(hits, 1):
        text = normalise(passage(hit))
        if all(fact_in(text, f) for f in facts):
            return rank
    return None


def summary(ranks: list[int | None], items: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """Hits at each cutoff, the questions missed at the first cutoff, and every rank."""
    return {
        "hits_at": {str(k): sum(1 for r in ranks if r is not None and r <= k) for k in CUTOFFS},
        "missed_at_4": [q for (q, _), r in zip(items, ranks, strict=True) if r is None or r > CUTOFFS[0]],
        "ranks": ranks,
    }


def ingest(kb: KnowledgeBase) -> float:
    """Add seed_demo's documentation files to ``kb`` as seed_demo does and ingest them here
    (no Celery worker); returns the seconds it took. Raises RuntimeError if one fails."""
    import knowledge.tasks
    from console.management.commands.seed_demo import DOCS_FILES
    from knowledge.ingestion import document_ingest
    from knowledge.services import document_add

    knowledge.tasks.document_ingest_enqueue = lambda **kwargs: None  # ingested below, synchronously
    started = time.perf_counter()
    with tenant_scope(kb.tenant_id):
        for name in DOCS_FILES:
            added = document_add(
                knowledge_base=kb,
                source_kind="file",
                source=name,
                content=(ROOT / name).read_bytes(),
                mime_type="text/markdown",
                title=name,
            )
            status = document_ingest(document_id=added.document.pk, generation=added.document.generation)
            if status != "ready":
                raise RuntimeError(f"{name} ended {status!r}")
    return time.perf_counter() - started


def measure(spec: dict[str, Any], items: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """One embedder: ingest, then every query variant's ranks (hybrid and vector list alone)."""
    from django.conf import settings

    from knowledge.models import Chunk
    from llm.embeddings import embed_texts

    host = spec["url"].split("//", 1)[1].split("/", 1)[0]
    settings.OUTBOUND_ALLOWED_HOSTS = [*settings.OUTBOUND_ALLOWED_HOSTS, host]
    with knowledge_common.throwaway_tenants(1) as (tenant,):
        provider = knowledge_common.embedding_provider(tenant, spec["url"])
        kb = KnowledgeBase.all_tenants.create(
            tenant=tenant,
            name="docs",
            embedding_provider=provider,
            embedding_model=spec["model"],
            dimensions=spec.get("dimensions", DIMENSIONS),
            chunk_size=spec.get("chunk_size", 500),
            chunk_overlap=spec.get("chunk_overlap", 50),
        )
        seconds = ingest(kb)
        chunks = Chunk.all_tenants.filter(knowledge_base=kb).count()
        print(f"{spec['label']}: {chunks} chunks ingested in {seconds:.0f} s", flush=True)
        variants: dict[str, Any] = {}
        for name, query in (spec.get("queries") or {"as passages": {}}).items():
            model, prefix = query.get("model", spec["model"]), query.get("prefix", "")
            hybrid: list[int | None] = []
            vector: list[int | None] = []
            for question, facts in items:
                vec = embed_texts(provider, model, [prefix + question])[0]
                with tenant_scope(tenant.pk):
                    for lists, out in ((("vector", "lexical"), hybrid), (("vector",), vector)):
                        hits = search(
                            tenant_id=tenant.pk,
                            knowledge_base_ids=[kb.pk],
                            query=question,
                            top_k=10,
                            lists=lists,
                            query_vector=vec,
                        )
                        out.append(first_rank(hits, facts))
            variants[name] = {
                "query_model": model,
                "query_prefix": prefix,
                "hybrid": summary(hybrid, items),
                "vector_only": summary(vector, items),
            }
    return {
        "label": spec["label"],
        "url": spec["url"],
        "model": spec["model"],
        "dimensions": kb.dimensions,
        "chunk_size": kb.chunk_size,
        "chunk_overlap": kb.chunk_overlap,
        "chunks": chunks,
        "ingest_s": round(seconds, 1),
        "variants": variants,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="Names the result file.")
    parser.add_argument("--shipped", action="store_true", help="Measure the embedded all-MiniLM-L6-v2 too.")
    parser.add_argument("--embedder", action="append", default=[], type=json.loads, help="A running server (JSON).")
    parser.add_argument("--note", default="", help="Free text kept in the result file.")
    parser.add_argument("--chunk", action="append", default=[], metavar="SIZE:OVERLAP",
                        help="The knowledge base's chunk size and overlap in characters (repeatable; default 500:50, "
                             "the platform's default; the demo's is 350:50); each embedder is measured with each.")
    args = parser.parse_args(argv)
    items = questions()
    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "label": args.label,
        "note": args.note,
        "questions": len(items),
        "load_before": round(os.getloadavg()[0], 2),
        "embedders": [],
    }
    chunkings = [tuple(int(n) for n in c.split(":", 1)) for c in args.chunk] or [(500, 50)]

    def each_chunking(spec: dict[str, Any]) -> None:
        for size, overlap in chunkings:
            label = spec["label"] if chunkings == [(500, 50)] else f"{spec['label']}, chunks {size}:{overlap}"
            record["embedders"].append(measure({**spec, "label": label, "chunk_size": size, "chunk_overlap": overlap},
                                               items))

    if args.shipped:
        with knowledge_common.embedder(threads=1) as url:
            each_chunking({"label": "all-MiniLM-L6-v2 (shipped)", "url": url, "model": "all-minilm-l6-v2"})
    for spec in args.embedder:
        each_chunking(spec)
    record["load_after"] = round(os.getloadavg()[0], 2)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"{dt.date.today().isoformat()}-{args.label}.json"
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"\n{len(items)} questions; load {record['load_before']} -> {record['load_after']}")
    print("| embedder | query | list | " + " | ".join(f"at {k}" for k in CUTOFFS) + " | ingest s |")
    print("|---|---|---|" + "---:|" * (len(CUTOFFS) + 1))
    for e in record["embedders"]:
        for name, v in e["variants"].items():
            for lst in ("hybrid", "vector_only"):
                cells = " | ".join(str(v[lst]["hits_at"][str(k)]) for k in CUTOFFS)
                print(f"| {e['label']} | {name} | {lst} | {cells} | {e['ingest_s']} |")
    for e in record["embedders"]:
        for name, v in e["variants"].items():
            print(f"{e['label']} / {name}: hybrid misses at 4: {v['hybrid']['missed_at_4']}")
    print(f"written {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
