"""Does the embedded model search and cite? The demo "Docs assistant" path, question by question.

For each question (the first ``--questions`` of bench/knowledge_quality.py's set, written for
README.md and ARCHITECTURE.md; ``--held-out`` takes its 14 ``ADDED_QUESTIONS`` instead), on
the embedded chat model (Qwen2.5-Coder-0.5B, text-mode tool calls, temperature 0, as
seed_demo's route), and for each ``--variant`` (:data:`VARIANTS`: what the model is shown):

1. the first model turn with tool choice ``knowledge_search`` (``search_first``: constrained
   decoding, llm.providers.openai_compat.build_request), with the variant's system prompt and
   tool spec: was the reply a valid call, what query did the model write, did it copy the
   ``query`` parameter's description or the tool's (a run of four of its words, or all of
   it), and was a
   passage that answers the question (knowledge_quality's excerpts) among the four found;
2. that query searched for real (both documents ingested through the real pipeline, the
   embedded embedder, top 4, the binding's ``top_k``), rendered as the variant renders it and
   framed as outside data as the runner frames it (sessions.runner.tool_execution);
3. the answer turn (tool choice auto), counting answers with at least one ``[n]`` that names
   a passage it was given (*cited*), answers that copy a passage's rendered opening line (the
   passages echoed, not an answer that cites: the first 34 characters of a passage's block,
   ``[n] …``), answers that copy an example answer the variant showed, "answers" that are
   only markers (``Sources: [1], [2]``), answers with an
   ``[n]`` naming none, and empty answers.

``current`` is what the platform sends (knowledge.kind.tool_description,
knowledge.tools.passages_render, seed_demo's DOCS_ASSISTANT_PROMPT); the other variants
change one or more of: the ``query`` parameter's description, the rendering of the passages,
the system prompt, and where a "cite as [n]" sentence goes (``in-result``: inside the
framed result; ``follow-up``: after it, in the text-mode follow-up
llm.toolcall_parsing.TOOL_RESULTS_FOLLOW_UP). Nothing edits the model's answer.

Figures depend on the machine's load (printed first); a 0.5B model's behaviour, not a
quality claim.

    .venv/bin/python bench/knowledge_citations.py [--questions 10] [--held-out] [--variant current ...]
        [--chat-url http://127.0.0.1:8081/v1] [--embeddings-url http://127.0.0.1:8082/v1]
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import knowledge_common  # noqa: E402
import knowledge_quality  # noqa: E402

from knowledge.models import KnowledgeBase  # noqa: E402
from knowledge.retrieval import search  # noqa: E402
from tenants.scoping import tenant_scope  # noqa: E402

ROOT = knowledge_common.ROOT
DOCUMENTS = ("README.md", "ARCHITECTURE.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
"""The demo knowledge base's files (console/management/commands/seed_demo.py, DOCS_FILES): the
README's former sections are in docs/ now."""

OLD_QUERY_DESCRIPTION = "What to look for, in natural language or keywords."
"""The ``query`` parameter's description before this bench's variants (session of issue 26)."""
OLD_PROMPT = (
    "You are Docs assistant. You answer questions about the Agent Platform from its documentation, which you "
    "search with knowledge_search. Answer in two to four sentences using only the passages it returns, and cite "
    "each passage you use by its number in square brackets, like [1]. If the passages do not answer the "
    "question, say so."
)
"""seed_demo's Docs assistant prompt before this bench's variants."""
FOLLOW_UP_EXAMPLE = (
    "Now answer my question in plain text using these results, unless you need another tool. After each "
    "sentence, write the number of the result it comes from, like this: The sweeper marks stale runs failed [2]."
)
FOLLOW_UP_SHORT = "Now answer my question in plain text using these results (cite them as [n]), unless you need another tool."
FOLLOW_UP_SCHEMATIC = (
    "Now answer my question in plain text using these results, unless you need another tool. End each sentence "
    "with the number of the result it comes from in square brackets, like [1]."
)
FOLLOW_UP_SOURCES = (
    "Now answer my question in plain text using these results, unless you need another tool. Then, on a last "
    "line, write Sources: and the numbers of the results you used in square brackets."
)
EXAMPLES = ("The sweeper marks stale runs failed", "Logs are kept for 30 days")
"""The example answers some variants show: an answer holding one copied the example."""
FEW_SHOT_PROMPT = OLD_PROMPT + (
    "\n\nExample. Passages: [1] The worker retries a failed call twice. [2] Logs are kept for 30 days.\n"
    "Question: How long are logs kept?\nAnswer: Logs are kept for 30 days [2]."
)


def render_old(hits, numbers):
    """The rendering before this bench's variants: ``[n] title › heading`` then the text."""
    from knowledge.tools import passages_render

    return passages_render(hits, numbers)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def render_inline(hits, numbers):
    """``[n] <text>`` on one line, then ``(from title › heading)``: the number where the
    answer's marker would go."""
    from knowledge.tools import passages_render

    _, citations = passages_render(hits, numbers)
    parts = []
    for hit, c in zip(hits, citations, strict=True):
        where = f"{hit.document_title} › {hit.heading}" if hit.heading else hit.document_title
        parts.append(f"[{c['n']}] {_flat(hit.text)} (from {where})")
    return "\n\n".join(parts), citations


def render_source_label(hits, numbers):
    """``Source [n] (title › heading):`` then the text."""
    from knowledge.tools import passages_render

    _, citations = passages_render(hits, numbers)
    parts = []
    for hit, c in zip(hits, citations, strict=True):
        where = f"{hit.document_title} › {hit.heading}" if hit.heading else hit.document_title
        parts.append(f"Source [{c['n']}] ({where}):\n{hit.text.strip()}")
    return "\n\n".join(parts), citations


def render_trailing(hits, numbers):
    """As before, and the passage's ``[n]`` again after its text (where an answer's marker goes)."""
    from knowledge.tools import passages_render

    _, citations = passages_render(hits, numbers)
    parts = []
    for hit, c in zip(hits, citations, strict=True):
        where = f"{hit.document_title} › {hit.heading}" if hit.heading else hit.document_title
        parts.append(f"[{c['n']}] {where}\n{hit.text.strip()} [{c['n']}]")
    return "\n\n".join(parts), citations


_SENTENCE_END = re.compile(r"(?<=[.!?])(\s+)(?=[A-Z`*(\"])")


def render_sentence_marks(hits, numbers):
    """As before, and every sentence of a passage followed by its ``[n]`` (sentence ends: a
    ``.``, ``!`` or ``?`` then space and a capital, and the passage's end)."""
    from knowledge.tools import passages_render

    _, citations = passages_render(hits, numbers)
    parts = []
    for hit, c in zip(hits, citations, strict=True):
        where = f"{hit.document_title} › {hit.heading}" if hit.heading else hit.document_title
        marked = _SENTENCE_END.sub(lambda m, n=c["n"]: f" [{n}]{m.group(1)}", hit.text.strip())
        parts.append(f"[{c['n']}] {where}\n{marked} [{c['n']}]")
    return "\n\n".join(parts), citations


def render_platform(hits, numbers):
    """What knowledge.tools.passages_render renders now."""
    from knowledge.tools import passages_render

    return passages_render(hits, numbers)


@dataclass(frozen=True)
class Variant:
    """What the model is shown. ``query_description`` None: the parameter has none."""

    query_description: str | None = OLD_QUERY_DESCRIPTION
    system_prompt: str = OLD_PROMPT
    render: Callable = render_old
    note: str = ""
    """"", "in-result" or "follow-up": where CITE_NOTE goes."""
    follow_up: str | None = None
    """The text-mode follow-up after the results instead of the platform's (None: the platform's)."""


BASE = Variant()
Q_QUESTION = "The user's question, word for word."
QQ = replace(BASE, query_description=Q_QUESTION)
"""The base of the variants below ``few-shot+inline``: q-question's query description."""
VARIANTS: dict[str, Variant] = {
    "old": BASE,
    "old+in-result": replace(BASE, note="in-result"),
    "q-none": replace(BASE, query_description=None),
    "q-question": replace(BASE, query_description=Q_QUESTION),
    "few-shot": replace(BASE, system_prompt=FEW_SHOT_PROMPT),
    "inline": replace(BASE, render=render_inline),
    "source-label": replace(BASE, render=render_source_label),
    "few-shot+inline": replace(BASE, system_prompt=FEW_SHOT_PROMPT, render=render_inline),
    "trailing": replace(QQ, render=render_trailing),
    "sentence-marks": replace(QQ, render=render_sentence_marks),
    "few-shot+sentence-marks": replace(QQ, system_prompt=FEW_SHOT_PROMPT, render=render_sentence_marks),
    "sentence-marks+follow-up": replace(QQ, render=render_sentence_marks, note="follow-up"),
    "fu-example": replace(QQ, follow_up=FOLLOW_UP_EXAMPLE),
    "fu-short": replace(QQ, follow_up=FOLLOW_UP_SHORT),
    "fu-example+sentence-marks": replace(QQ, follow_up=FOLLOW_UP_EXAMPLE, render=render_sentence_marks),
    "fu-schematic": replace(QQ, follow_up=FOLLOW_UP_SCHEMATIC),
    "fu-sources": replace(QQ, follow_up=FOLLOW_UP_SOURCES),
    "fu-schematic+sentence-marks": replace(QQ, follow_up=FOLLOW_UP_SCHEMATIC, render=render_sentence_marks),
    "fu-short+sentence-marks": replace(QQ, follow_up=FOLLOW_UP_SHORT, render=render_sentence_marks),
}


def _current() -> Variant:
    from console.management.commands.seed_demo import DOCS_ASSISTANT_PROMPT
    from knowledge.tools import QUERY_DESCRIPTION

    return Variant(query_description=QUERY_DESCRIPTION, system_prompt=DOCS_ASSISTANT_PROMPT, render=render_platform)


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


def copied(query: str, description: str | None) -> bool:
    """Whether ``query`` copies ``description``: all of it, or a run of four of its words."""
    if not description:
        return False
    q, d = _flat(query).lower(), _flat(description).lower().rstrip(".")
    words = re.findall(r"[\w']+", d)
    return d in q or any(" ".join(words[i:i + 4]) in q for i in range(max(len(words) - 3, 0)))


def classify(answer: str, text: str, given: set[int]) -> tuple[str, set[int]]:
    """``(kind, marks)``: kind is ``empty``, ``echoed`` (the answer holds a passage's rendered
    opening: the first 34 characters of a block of ``text`` starting with ``[n]``), ``example`` (it copies an example answer of
    :data:`EXAMPLES`), ``marks_only`` (fewer than 20 letters besides ``[n]`` and "Sources:":
    no answer), ``cited`` (an ``[n]`` naming
    a passage in ``given``), ``wrong_n`` (only ``[n]`` naming none) or ``none``."""
    marks = {int(n) for n in re.findall(r"\[(\d+)\]", answer)}
    openings = [block.strip()[:34] for block in text.split("\n\n") if block.strip().startswith("[")]
    if not answer:
        return "empty", marks
    if any(e.lower() in answer.lower() for e in EXAMPLES):
        return "example", marks
    if len(re.findall(r"[A-Za-z]", re.sub(r"\[\d+\]|Sources?:", "", answer))) < 20:
        return "marks_only", marks
    if any(_flat(o) in _flat(answer) for o in openings):
        return "echoed", marks
    if marks & given:
        return "cited", marks
    if marks:
        return "wrong_n", marks
    return "none", marks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--held-out", action="store_true", help="knowledge_quality's ADDED_QUESTIONS instead")
    parser.add_argument("--variant", action="append", help=f"current or one of {sorted(VARIANTS)} (repeatable)")
    parser.add_argument("--chat-url", default="", help="a running chat model server (default: start one)")
    parser.add_argument("--embeddings-url", default="", help="a running embeddings server (default: start one)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="the model name sent (reported)")
    args = parser.parse_args()

    from django.conf import settings

    import knowledge.tasks
    import llm.toolcall_parsing as parsing
    from knowledge.ingestion import document_ingest
    from knowledge.kind import KnowledgeBindingSpec, tool_description
    from knowledge.services import document_add_text
    from knowledge.tools import CITE_NOTE, CitationNumbers, KnowledgeSearchTool
    from llm.types import ChatMessage, ToolCallRequest
    from sessions.runner.tool_execution import UNTRUSTED_SYSTEM_NOTE, frame_untrusted

    names = args.variant or ["current"]
    variants = {n: (_current() if n == "current" else VARIANTS[n]) for n in names}
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; model {args.model}")
    pool = knowledge_quality.ADDED_QUESTIONS if args.held_out else knowledge_quality.QUESTIONS
    questions = pool[: args.questions]
    docs = {name: (ROOT / name).read_text(encoding="utf-8") for name in DOCUMENTS}
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
    hosts = [url.split("//", 1)[1].split("/", 1)[0]]
    if args.embeddings_url:
        hosts.append(args.embeddings_url.split("//", 1)[1].split("/", 1)[0])
    settings.OUTBOUND_ALLOWED_HOSTS = [*settings.OUTBOUND_ALLOWED_HOSTS, *hosts]
    entry = replace(_entry(url), model=args.model)
    follow_up = parsing.TOOL_RESULTS_FOLLOW_UP
    keys = ("valid", "copied", "relevant", "cited", "echoed", "example", "marks_only", "wrong_n", "empty", "none")
    tallies = {n: dict.fromkeys(keys, 0) | {"seconds": 0.0} for n in variants}
    embedder = (knowledge_common.embedder() if not args.embeddings_url
                else __import__("contextlib").nullcontext(args.embeddings_url))
    try:
        with embedder as embed_url, knowledge_common.throwaway_tenants(1) as (tenant,):
            kb = KnowledgeBase.all_tenants.create(
                tenant=tenant, name="Platform documentation",
                description="The Agent Platform's README and ARCHITECTURE: setup, usage, API, design.",
                embedding_provider=knowledge_common.embedding_provider(tenant, embed_url),
                embedding_model="all-minilm-l6-v2", dimensions=384)
            with tenant_scope(tenant.pk):
                for name, text in docs.items():
                    added = document_add_text(knowledge_base=kb, title=name, text=text)
                    assert document_ingest(document_id=added.document.pk, generation=added.document.generation) == "ready"
            description = tool_description(KnowledgeBindingSpec(
                knowledge_base_ids=(kb.pk,), names=(kb.name,), descriptions=(kb.description,), top_k=4,
                search_first=True, user_uploads=True))
            system_note = UNTRUSTED_SYSTEM_NOTE
            forced: dict[tuple[str, str, str], object] = {}
            for question, excerpts in questions:
                print(f"Q: {question}")
                for vname, v in variants.items():
                    tool = KnowledgeSearchTool(exposed="knowledge_search", retrieval=None, default_top_k=4,
                                               numbers=CitationNumbers, description=description)
                    props = tool.spec.parameters["properties"]["query"]
                    if v.query_description is None:
                        props.pop("description", None)
                    else:
                        props["description"] = v.query_description
                    tally = tallies[vname]
                    system = f"{v.system_prompt}\n\n{system_note}"
                    history = [ChatMessage(role="system", content=system), ChatMessage(role="user", content=question)]
                    started = time.perf_counter()
                    key = (system, question, json.dumps(tool.spec.to_openai(), sort_keys=True))
                    if key not in forced:  # the same prompt at temperature 0: asked once
                        forced[key] = asyncio.run(_call(entry, history, [tool.spec], "knowledge_search"))
                    first = forced[key]
                    calls = first.message.tool_calls
                    if not (len(calls) == 1 and calls[0].name == "knowledge_search"):
                        print(f"  {vname}: no valid call: {first.message.content[:120]!r}")
                        continue
                    tally["valid"] += 1
                    query = str(json.loads(calls[0].arguments).get("query", ""))
                    is_copy = copied(query, v.query_description or OLD_QUERY_DESCRIPTION) or copied(query, description)
                    tally["copied"] += is_copy
                    hits = search(tenant_id=tenant.pk, knowledge_base_ids=[kb.pk], query=query or question, top_k=4)
                    relevant = knowledge_quality._rank(hits, excerpts) is not None
                    tally["relevant"] += relevant
                    text, citations = v.render(hits, CitationNumbers())
                    given = {c["n"] for c in citations}
                    call = ToolCallRequest(id="call_bench", name="knowledge_search", arguments=calls[0].arguments)
                    content = f"{text}\n\n{CITE_NOTE}" if v.note == "in-result" else text
                    base = follow_up if v.follow_up is None else v.follow_up
                    parsing.TOOL_RESULTS_FOLLOW_UP = f"{base} {CITE_NOTE}" if v.note == "follow-up" else base
                    messages = [*history, ChatMessage(role="assistant", content="", tool_calls=(call,)),
                                ChatMessage(role="tool", content=frame_untrusted(content), tool_call_id=call.id,
                                            name=call.name)]
                    try:
                        answer = asyncio.run(_call(entry, messages, [tool.spec], "auto")).message.content.strip()
                    finally:
                        parsing.TOOL_RESULTS_FOLLOW_UP = follow_up
                    tally["seconds"] += time.perf_counter() - started
                    kind, marks = classify(answer, text, given)
                    tally[kind] += 1
                    print(f"  {vname}: query {query!r}{' (copied)' if is_copy else ''}, relevant found: "
                          f"{'yes' if relevant else 'no'}; {kind} {sorted(marks)}: {answer[:200]!r}", flush=True)
    finally:
        if chat is not None:
            chat.terminate()
            chat.wait(timeout=20)
    n = len(questions)
    print(f"\n{n} questions ({'held-out' if args.held_out else 'first'}), model {args.model}")
    print("| variant | valid calls | query copies a description | relevant passage found | answers citing a "
          "given passage | passages echoed | example copied | only [n], no answer | [n] naming none | no [n] | empty | s/question |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for vname, t in tallies.items():
        print(f"| {vname} | {t['valid']}/{n} | {t['copied']} | {t['relevant']} | {t['cited']}/{t['valid']} | "
              f"{t['echoed']} | {t['example']} | {t['marks_only']} | {t['wrong_n']} | {t['none']} | {t['empty']} | {t['seconds'] / max(t['valid'], 1):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
