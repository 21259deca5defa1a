"""Reads of the evaluation app: experiments with their results, and the comparison of two
experiments item by item."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent_platform.api_errors import ApplicationError, NotFound
from evaluation.models import DatasetItem, Experiment, ExperimentResult, ResultStatus


def experiment_get(*, experiment_id: int) -> Experiment:
    """The tenant's experiment ``experiment_id`` (tenant scope required).

    Raises:
        NotFound: missing or another tenant's (the same message).
    """
    experiment = Experiment.objects.filter(pk=experiment_id).select_related("dataset", "agent").first()
    if experiment is None:
        raise NotFound("Experiment not found.")
    return experiment


def _mean_score(scores: dict[str, Any]) -> float | None:
    values = [s["score"] for s in scores.values() if "score" in s]
    return sum(values) / len(values) if values else None


def _per_item(results: Iterable[ExperimentResult]) -> dict[int, dict[str, Any]]:
    """Per item: ``{runs, passed, pass_rate, mean_score}`` over its repetitions that ran."""
    grouped: dict[int, list[ExperimentResult]] = {}
    for result in results:
        if result.status in (ResultStatus.DONE, ResultStatus.ERROR):
            grouped.setdefault(result.item_id, []).append(result)
    items: dict[int, dict[str, Any]] = {}
    for item_id, rows in grouped.items():
        passed = sum(1 for r in rows if r.passed)
        means = [m for m in (_mean_score(r.scores or {}) for r in rows) if m is not None]
        items[item_id] = {
            "runs": len(rows),
            "passed": passed,
            "pass_rate": passed / len(rows),
            "mean_score": round(sum(means) / len(means), 4) if means else None,
            "results": [r.pk for r in rows],
        }
    return items


def _change(a: dict[str, Any] | None, b: dict[str, Any] | None) -> tuple[str, float]:
    """``(change, delta)`` of B against A for one item: ``regression`` / ``improvement`` by the
    pass rate, then by the mean score; ``same``; ``missing`` when either did not run it.
    ``delta``: B's pass rate minus A's (the mean scores' difference when the rates are equal)."""
    if a is None or b is None:
        return "missing", 0.0
    delta = b["pass_rate"] - a["pass_rate"]
    if delta == 0 and a["mean_score"] is not None and b["mean_score"] is not None:
        delta = b["mean_score"] - a["mean_score"]
    if abs(delta) < 1e-9:
        return "same", 0.0
    return ("regression" if delta < 0 else "improvement"), round(delta, 4)


CHANGE_ORDER = {"regression": 0, "improvement": 1, "missing": 2, "same": 3}


def experiments_compare(*, a: Experiment, b: Experiment) -> dict[str, Any]:
    """Experiment B against A, item by item, regressions first (the largest drop first), then
    improvements (the largest gain first), items only one of them ran, unchanged ones.

    Returns:
        ``{a: {id, agent, summary}, b: {...}, pass_rate_delta, counts: {regression,
        improvement, missing, same}, items: [{item, input, change, delta, a: {runs, passed,
        pass_rate, mean_score, results}, b: {...}}]}``.

    Raises:
        ApplicationError: the two experiments are of different datasets.
    """
    if a.dataset_id != b.dataset_id:
        raise ApplicationError("Both experiments must be of the same dataset.")
    per_a = _per_item(ExperimentResult.objects.filter(experiment=a))
    per_b = _per_item(ExperimentResult.objects.filter(experiment=b))
    inputs = dict(DatasetItem.objects.filter(pk__in=set(per_a) | set(per_b)).values_list("pk", "input"))
    rows = []
    for item_id in sorted(inputs):
        change, delta = _change(per_a.get(item_id), per_b.get(item_id))
        rows.append(
            {
                "item": item_id,
                "input": inputs[item_id],
                "change": change,
                "delta": delta,
                "a": per_a.get(item_id),
                "b": per_b.get(item_id),
            }
        )
    rows.sort(key=lambda r: (CHANGE_ORDER[r["change"]], -abs(r["delta"]), r["item"]))
    counts = {name: sum(1 for r in rows if r["change"] == name) for name in CHANGE_ORDER}
    rate_a, rate_b = a.summary.get("pass_rate"), b.summary.get("pass_rate")
    return {
        "a": {"id": a.pk, "agent": a.agent_id, "status": a.status, "summary": a.summary},
        "b": {"id": b.pk, "agent": b.agent_id, "status": b.status, "summary": b.summary},
        "pass_rate_delta": round(rate_b - rate_a, 4) if rate_a is not None and rate_b is not None else None,
        "counts": counts,
        "items": rows,
    }
