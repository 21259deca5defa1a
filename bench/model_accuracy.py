"""How right is the embedded default model? The demo agents on the shipped datasets, question by
question (issue 38).

Runs ``manage.py evaluate`` (the command a user runs: an ordinary experiment, each item an
ordinary run of the agent on the demo database, the agent's own prompt, route, retrieval
settings and chunking) for each ``--pair DATASET=AGENT``, then reads the experiment's results
back and writes, per question: passed or not, each scorer's detail, the time from the run's
start to its full answer, the tool calls the model made, the answer, and for questions that
expect facts a **diagnosis** of a failure:

* ``retrieval miss``: no passage the run was given (its ``knowledge_search`` results, and the
  passages retrieved before its first turn) holds every expected fact;
* ``model misread``: a passage held them, the answer does not;
* ``no answer``: the run failed or answered nothing.

For questions that expect tool calls: ``no tool call``, ``wrong arguments`` (the expected
call's arguments not among the calls made), ``answer format`` (the call was right, the answer
does not match the expected pattern); and, stricter than the dataset's scorers, whether the answer
states the hour the time tool returned (``states_tool_time``: the end-to-end test's check, AM/PM
included).

It also reads the peak resident memory (``VmHWM``) of the chat model's server process (found
in ``/proc`` by its ``llama_cpp.server`` command line and ``--port``) and the 1-minute load
average before and after, so the figures say how loaded the machine was.

Needs the demo database seeded (``manage.py seed_demo``) with the documentation ingested, the
model server and the embeddings server running (as ``make run`` starts them, or by hand:
``scripts/llm_server.py``), and no Celery worker is needed (``evaluate`` runs each run in its
own process, eagerly).

    .venv/bin/python bench/model_accuracy.py --label qwen0.5b \\
        --pair "Docs QA=docs-assistant" --pair "Tool use=assistant" [--llm-port 8081] [--every 3] \\
        [--report-only EXP_ID ...]

Writes ``bench/results/model_accuracy/<date>-<label>.json`` and prints a summary table (the
README's and docs/model-accuracy.md's figures come from these files; ``--markdown FILE ...``
prints a file's questions as Markdown tables).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

from _stats import percentile  # noqa: E402

OUT_DIR = ROOT / "bench" / "results" / "model_accuracy"


def server_pid(port: int) -> int | None:
    """The pid of the ``llama_cpp.server`` process started with ``--port <port>``, if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "llama_cpp.server" in words and "--port" in words and words[words.index("--port") + 1:][:1] == [str(port)]:
            return int(entry.name)
    return None


def memory_mb(pid: int | None) -> dict[str, float] | None:
    """``{"rss_mb", "peak_rss_mb"}`` of ``pid`` from /proc/<pid>/status, or None."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = {k: int(v) / 1024 for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return {"rss_mb": round(found.get("VmRSS", 0), 1), "peak_rss_mb": round(found.get("VmHWM", 0), 1)}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def run_evaluate(dataset: str, agent: str) -> None:
    """``manage.py evaluate`` as a user runs it (its exit code 1 below --fail-under is expected)."""
    cmd = [sys.executable, "manage.py", "evaluate", "--dataset", dataset, "--agent", agent, "--fail-under", "0.8"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=False)


def _diagnose_facts(expected: dict[str, Any], passed: bool, output: str, status: str, passages: list[str]) -> str:
    from evaluation.scorers import fact_in, normalise

    if passed:
        return ""
    if status != "done" or not output.strip():
        return "no answer"
    text = normalise("\n".join(passages))
    return "model misread" if all(fact_in(text, f) for f in expected.get("facts", [])) else "retrieval miss"


def _diagnose_tools(expected: dict[str, Any], passed: bool, output: str, status: str,
                    calls: list[dict[str, Any]]) -> str:
    if passed:
        return ""
    if not calls:
        return "no tool call"
    scores_ok = all(
        any(c["name"] == e["name"] and all(c["arguments"].get(k) == v for k, v in e.get("arguments_subset", {}).items())
            for c in calls)
        for e in expected.get("tool_calls", []))
    if not scores_ok:
        return "wrong arguments"
    return "answer format" if status == "done" and output.strip() else "no answer"


def states_tool_time(output: str, calls: list[dict[str, Any]]) -> bool | None:
    """For an answer after ``time__get_current_time`` calls: whether it states the local hour
    (with the right AM/PM, if any) of a date-time a succeeded call returned (the end-to-end
    test's :func:`gives_the_hour`); None when no such call succeeded. Stricter than the Tool use
    dataset's scorers, which check the call and that the answer holds a time."""
    from agent_platform.tests.test_local_model_e2e import gives_the_hour, tool_datetimes

    returned = [at for c in calls if c["name"] == "time__get_current_time" and c["status"] == "succeeded"
                for at in tool_datetimes(c)]
    return any(gives_the_hour(output, at) for at in returned) if returned else None


def experiment_rows(experiment_id: int) -> dict[str, Any]:
    """The experiment's summary and one row per result (see the module's docstring)."""
    from evaluation.models import Experiment, ExperimentResult
    from sessions.models import Run, ToolCall

    experiment = Experiment.all_tenants.select_related("dataset", "agent").get(pk=experiment_id)
    rows = []
    for result in ExperimentResult.all_tenants.filter(experiment=experiment).select_related("item").order_by("item_id"):
        calls = list(ToolCall.all_tenants.filter(run_id=result.run_id).order_by("pk")) if result.run_id else []
        call_rows = [{"name": c.name, "arguments": c.arguments, "status": c.status, "result": c.result[:300],
                      "result_data": c.result_data if isinstance(c.result_data, dict) else None} for c in calls]
        passages = [c.result for c in calls if c.name.endswith("knowledge_search")]
        if result.run_id:  # retrieval before the first turn: the run's stored start context
            context = Run.all_tenants.filter(pk=result.run_id).values_list("context", flat=True).first() or []
            passages += [b.get("text", "") for b in context if isinstance(b, dict) and b.get("source") == "knowledge"]
        expected = result.item.expected
        if expected.get("facts"):
            diagnosis = _diagnose_facts(expected, bool(result.passed), result.output, result.status, passages)
        else:
            diagnosis = _diagnose_tools(expected, bool(result.passed), result.output, result.status, call_rows)
        rows.append({
            "input": result.item.input, "expected": expected, "passed": bool(result.passed),
            "states_tool_time": states_tool_time(result.output, call_rows),
            "status": result.status, "latency_ms": result.latency_ms, "scores": result.scores,
            "diagnosis": diagnosis, "tool_calls": call_rows, "output": result.output, "error": result.error,
            "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
        })
    latencies = [r["latency_ms"] / 1000 for r in rows if r["latency_ms"] is not None]
    passed = sum(r["passed"] for r in rows)
    diagnoses: dict[str, int] = {}
    for r in rows:
        if r["diagnosis"]:
            diagnoses[r["diagnosis"]] = diagnoses.get(r["diagnosis"], 0) + 1
    timed = [r["states_tool_time"] for r in rows if r["states_tool_time"] is not None]
    return {
        "experiment": experiment.pk, "dataset": experiment.dataset.name, "agent": experiment.agent.name,
        "status": experiment.status, "items": len(rows), "passed": passed,
        "states_tool_time": sum(timed) if timed else None,
        "accuracy": round(passed / len(rows), 3) if rows else None,
        "median_s": round(statistics.median(latencies), 2) if latencies else None,
        "p95_s": round(percentile(latencies, 0.95), 2) if latencies else None,
        "diagnoses": diagnoses, "rows": rows,
    }


def _cell(text: str, limit: int = 120) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    flat = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    # A model's Markdown link is shown as text, not followed (its target is relative to the docs).
    return flat.replace("|", "\\|").replace("](", "] (")


def markdown(record: dict[str, Any]) -> str:
    """A result file's experiments as Markdown: one table row per question."""
    out = []
    for e in record["experiments"]:
        out.append(f"**{e['dataset']} / {e['agent']}** ({record['label']}, {record['date'][:10]}): "
                   f"{e['passed']} of {e['items']}, median {e['median_s']} s, p95 {e['p95_s']} s\n")
        out.append("| question | right | why not | s | answer |\n|---|---|---|---:|---|")
        for r in e["rows"]:
            out.append(f"| {_cell(r['input'], 70)} | {'yes' if r['passed'] else 'no'} | {r['diagnosis']} | "
                       f"{(r['latency_ms'] or 0) / 1000:.1f} | {_cell(r['output'])} |")
        out.append("")
    return "\n".join(out)


def subset_dataset(name: str, every: int) -> str:
    """The dataset "<name> every <every>" (its items 1, 1 + every, 1 + 2 × every, … in order),
    made in the same tenant the first time; returns its name. For iterating on a subset; the
    questions are the same on every machine (the shipped dataset's file order)."""
    from evaluation.models import Dataset, DatasetItem
    from evaluation.services import dataset_items_add, dataset_save
    from tenants.scoping import tenant_scope

    subset = f"{name} every {every}"
    full = Dataset.all_tenants.get(name=name)
    if not Dataset.all_tenants.filter(tenant_id=full.tenant_id, name=subset).exists():
        items = list(DatasetItem.all_tenants.filter(dataset=full).order_by("pk"))[::every]
        with tenant_scope(full.tenant_id):
            dataset = dataset_save(tenant=full.tenant, name=subset, description=f"Every {every} items of {name}, from the first.")
            dataset_items_add(dataset=dataset, items=[{"input": i.input, "messages": i.messages, "expected": i.expected,
                                                       "metadata": i.metadata} for i in items])
    return subset


def newest_experiment(dataset: str, agent_slug: str) -> int:
    from evaluation.models import Experiment

    return Experiment.all_tenants.filter(dataset__name=dataset, agent__slug=agent_slug).latest("pk").pk


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="Names the result file (e.g. the model).")
    parser.add_argument("--pair", action="append", default=[], help='"DATASET=AGENT_SLUG", repeatable.')
    parser.add_argument("--report-only", type=int, nargs="*", default=None,
                        help="Report these experiments' results instead of running evaluate.")
    parser.add_argument("--llm-port", type=int, default=8081)
    parser.add_argument("--every", type=int, default=1,
                        help="Run every Nth item of each dataset (a dataset of its own, made once; see subset_dataset).")
    parser.add_argument("--note", default="", help="Free text kept in the result file (what was changed).")
    parser.add_argument("--markdown", nargs="*", default=None, metavar="RESULT_JSON",
                        help="Print these result files' questions as Markdown tables (no run).")
    args = parser.parse_args(argv)
    if args.markdown is not None:
        for name in args.markdown:
            print(markdown(json.loads(Path(name).read_text(encoding="utf-8"))))
        return 0

    import django

    django.setup()
    from tenants.scoping import system_scope

    pid = server_pid(args.llm_port)
    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "label": args.label, "note": args.note,
        "load_before": load_average(), "quiet_gate": Path("/tmp/QUIET").exists(), "experiments": [],
    }
    with system_scope():  # an operator's script: reads the demo tenant's rows
        if args.report_only is not None:
            ids = args.report_only
        else:
            ids = []
            for pair in args.pair:
                dataset, _, agent = pair.partition("=")
                if args.every > 1:
                    dataset = subset_dataset(dataset, args.every)
                run_evaluate(dataset, agent)
                ids.append(newest_experiment(dataset, agent))
        record["experiments"] = [experiment_rows(i) for i in ids]
    record["load_after"] = load_average()
    record["llm_server_memory"] = memory_mb(pid)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"{dt.date.today().isoformat()}-{args.label}.json"
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"\nload {record['load_before']} -> {record['load_after']}; server memory {record['llm_server_memory']}")
    for e in record["experiments"]:
        print(f"{e['dataset']} / {e['agent']} (experiment {e['experiment']}, {e['status']}): "
              f"{e['passed']}/{e['items']} = {e['accuracy']}, median {e['median_s']} s, p95 {e['p95_s']} s; "
              f"failures: {e['diagnoses']}"
              + (f"; states the tool's time: {e['states_tool_time']}" if e.get("states_tool_time") is not None else ""))
        for r in e["rows"]:
            mark = "PASS" if r["passed"] else f"FAIL {r['diagnosis']}"
            answer = re.sub(r"\s+", " ", r["output"])[:110]
            print(f"  {mark:22} {(r['latency_ms'] or 0) / 1000:6.1f}s  {r['input'][:60]!r:64} {answer!r}")
    print(f"written {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
