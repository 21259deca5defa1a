"""Does the embedded model search and cite? The demo "Docs assistant" path, question by question.

For each question (the first ``--questions`` of bench/knowledge_quality.py's set, written for
README.md and ARCHITECTURE.md), on the embedded chat model (Qwen2.5-Coder-0.5B, text-mode tool
calls, temperature 0, as seed_demo's route):

1. the first model turn with tool choice ``knowledge_search`` (``search_first``: constrained
   decoding, llm.providers.openai_compat.build_request), with seed_demo's Docs assistant
   system prompt: was the reply a valid call, and what query did the model write;
2. that query searched for real (both documents ingested through the real pipeline, the
   embedded embedder, top 4, the binding's ``top_k``), rendered as the tool's result
   (knowledge.tools.passages_render) and framed as outside data as the runner frames it;
3. the answer turn (tool choice auto), once per placement of the "cite as [n]" sentence:

   - ``in-result``: inside the tool's result (so inside the untrusted-data frame), as before;
   - ``follow-up``: after the framed result, appended to the text-mode follow-up the platform
     writes (llm.toolcall_parsing.TOOL_RESULTS_FOLLOW_UP), and not in the result.

   (The platform sends neither: the passages alone, and the request to cite in the tool's
   description and the system prompt.)

   counting answers with at least one ``[n]`` that names a passage it was given (and that do
   not just copy a passage's ``[n] title › heading`` line), answers that copy such a line
   (the passages echoed, not an answer that cites), answers with an ``[n]`` naming none, and
   empty answers. The system prompt asks for [n] citations in
   both (seed_demo's).

Figures depend on the machine's load (printed first); a 0.5B model's behaviour, not a
quality claim.

    .venv/bin/python bench/knowledge_citations.py [--questions 10] [--chat-url http://127.0.0.1:8081/v1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import knowledge_common  # noqa: E402
import knowledge_quality  # noqa: E402

from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.retrieval import search  # noqa: E402
from tenants.scoping import tenant_scope  # noqa: E402

ROOT = knowledge_common.ROOT
PLACEMENTS = ("in-result", "follow-up")


def _entry(url: str):
    from llm.config import RouteEntryConfig

    return RouteEntryConfig(index=0, provider_name="local", base_url=url, api_key="",
                            model="qwen2.5-coder-0.5b-instruct", max_input_tokens=8192, max_output_tokens=512,
                            connect_timeout_seconds=5.0, read_timeout_seconds=600.0, tool_calls="text",
                            temperature=0.0)


async def _call(entry, messages, tools, tool_choice: str):
    from llm.model import ModelSettings
    from llm.providers.openai_compat import OpenAICompatModel
    from llm.types import Completion

    completion = None
    async for event in OpenAICompatModel(entry).stream(messages, tools, ModelSettings(tool_choice=tool_choice)):
        if isinstance(event, Completion):
            completion = event
    return completion


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--chat-url", default="", help="a running chat model server (default: start one)")
    args = parser.parse_args()

    from django.conf import settings

    import knowledge.tasks
    import llm.toolcall_parsing as parsing
    from console.management.commands.seed_demo import DOCS_ASSISTANT_PROMPT
    from knowledge.services import document_add_text, document_ingest
    from knowledge.tools import CITE_NOTE, CitationNumbers, KnowledgeSearchTool, passages_render
    from llm.types import ChatMessage, ToolCallRequest
    from sessions.runner.tool_execution import UNTRUSTED_SYSTEM_NOTE, frame_untrusted

    load = os.getloadavg()
    print(f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    questions = [q for q, _ in knowledge_quality.QUESTIONS[: args.questions]]
    docs = {name: (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "ARCHITECTURE.md")}
    knowledge.tasks.document_ingest_enqueue = lambda **kwargs: None
    chat = None
    url = args.chat_url
    if not url:
        import llm_server
        import setup_model

        port = knowledge_common.free_port()
        env = {**os.environ, "LLM_PORT": str(port), "LLM_HOST": "127.0.0.1", "LLM_VERBOSE": "false",
               "LLM_MODEL_PATH": str(setup_model.ensure_model())}
        chat = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/v1"
        if not llm_server.wait_ready(url, timeout_seconds=180):
            raise RuntimeError("the chat model server did not start")
    host = url.split("//", 1)[1].split("/", 1)[0]
    settings.OUTBOUND_ALLOWED_HOSTS = [*settings.OUTBOUND_ALLOWED_HOSTS, host]
    entry = _entry(url)
    follow_up = parsing.TOOL_RESULTS_FOLLOW_UP
    tallies = {p: {"cited": 0, "echoed": 0, "wrong_n": 0, "empty": 0, "seconds": 0.0} for p in PLACEMENTS}
    valid_calls = 0
    try:
        with knowledge_common.embedder() as embed_url, knowledge_common.throwaway_tenants(1) as (tenant,):
            kb = KnowledgeBase.all_tenants.create(
                tenant=tenant, name="Platform documentation",
                embedding_provider=knowledge_common.embedding_provider(tenant, embed_url),
                embedding_model="all-minilm-l6-v2", dimensions=384)
            with tenant_scope(tenant.pk):
                for name, text in docs.items():
                    added = document_add_text(knowledge_base=kb, title=name, text=text)
                    assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
            tool = KnowledgeSearchTool(
                exposed="knowledge_search", retrieval=None, default_top_k=4, numbers=CitationNumbers,
                description=("Search the knowledge bases (“Platform documentation”: The Agent Platform's README "
                             "and ARCHITECTURE: setup, usage, API, design.) for passages relevant to a query. "
                             "Returns numbered passages; cite the ones you use as [n]. Use it for questions these "
                             "documents can answer."))
            system = f"{DOCS_ASSISTANT_PROMPT}\n\n{UNTRUSTED_SYSTEM_NOTE}"
            for question in questions:
                history = [ChatMessage(role="system", content=system), ChatMessage(role="user", content=question)]
                started = time.perf_counter()
                first = asyncio.run(_call(entry, history, [tool.spec], "knowledge_search"))
                calls = first.message.tool_calls
                forced_s = time.perf_counter() - started
                if not (len(calls) == 1 and calls[0].name == "knowledge_search"):
                    print(f"Q: {question}\n  no valid call: {first.message.content[:120]!r}")
                    continue
                valid_calls += 1
                query = str(json.loads(calls[0].arguments).get("query", ""))
                hits = search(tenant_id=tenant.pk, knowledge_base_ids=[kb.pk], query=query or question, top_k=4)
                text, citations = passages_render(hits, CitationNumbers())
                given = {c["n"] for c in citations}
                print(f"Q: {question}\n  query ({forced_s:.0f} s): {query!r}; passages {sorted(given)}")
                call = ToolCallRequest(id="call_bench", name="knowledge_search", arguments=calls[0].arguments)
                for placement in PLACEMENTS:
                    if placement == "in-result":
                        content, parsing.TOOL_RESULTS_FOLLOW_UP = f"{text}\n\n{CITE_NOTE}", follow_up
                    else:
                        content, parsing.TOOL_RESULTS_FOLLOW_UP = text, f"{follow_up} {CITE_NOTE}"
                    messages = [*history, ChatMessage(role="assistant", content="", tool_calls=(call,)),
                                ChatMessage(role="tool", content=frame_untrusted(content), tool_call_id=call.id,
                                            name=call.name)]
                    started = time.perf_counter()
                    answer = asyncio.run(_call(entry, messages, [tool.spec], "auto")).message.content.strip()
                    tallies[placement]["seconds"] += time.perf_counter() - started
                    marks = {int(n) for n in re.findall(r"\[(\d+)\]", answer)}
                    tally = tallies[placement]
                    if not answer:
                        tally["empty"] += 1
                    elif any(f"[{c['n']}] {c['document_title']} ›" in answer for c in citations):
                        tally["echoed"] += 1
                    elif marks & given:
                        tally["cited"] += 1
                    elif marks:
                        tally["wrong_n"] += 1
                    print(f"  {placement}: cites {sorted(marks)}: {answer[:160]!r}", flush=True)
                parsing.TOOL_RESULTS_FOLLOW_UP = follow_up
    finally:
        if chat is not None:
            chat.terminate()
            chat.wait(timeout=20)
    print(f"\nvalid forced calls: {valid_calls}/{len(questions)}")
    print("| cite sentence | answers citing a given passage | passages echoed | [n] naming none | empty | s/answer |")
    print("|---|---:|---:|---:|---:|---:|")
    for placement, t in tallies.items():
        print(f"| {placement} | {t['cited']}/{valid_calls} | {t['echoed']} | {t['wrong_n']} | {t['empty']} | "
              f"{t['seconds'] / max(valid_calls, 1):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
