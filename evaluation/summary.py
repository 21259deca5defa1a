"""An experiment's numbers from its results: pass rate with its 95 % interval, mean score per
scorer, latency percentiles, tokens and cost. Pure functions (no database)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Z_95 = 1.959963984540054
"""The standard normal quantile for a two-sided 95 % interval (Φ⁻¹(0.975))."""


def wilson_interval(successes: int, trials: int, *, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion: ``(low, high)`` in 0..1.

    Source: E. B. Wilson, "Probable inference, the law of succession, and statistical
    inference", Journal of the American Statistical Association 22 (158), 1927, pp. 209-212;
    recommended over the normal (Wald) interval for small samples and rates near 0 or 1 by
    A. Agresti and B. A. Coull, "Approximate is better than 'exact' for interval estimation of
    binomial proportions", The American Statistician 52 (2), 1998, pp. 119-126::

        centre = (p + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²)

    ``(0.0, 1.0)`` when there are no trials. Example: 8 of 10 → (0.490, 0.943).
    """
    if trials <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be within 0..{trials}, not {successes}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (max(0.0, centre - half), min(1.0, centre + half))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0 < q ≤ 100) by the nearest-rank method (the smallest value
    with at least q % of the values at or below it; NIST/Hyndman-Fan definition 1), or None
    for no values. p50 of [1, 2, 3, 4] is 2; p95 of 1..20 is 19."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _scorer_means(ran: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{scorer: {mean, count, passed}}`` over the results' scores that scored (not skipped)."""
    per_scorer: dict[str, list[Mapping[str, Any]]] = {}
    for r in ran:
        for name, score in (r.get("scores") or {}).items():
            if "score" in score:
                per_scorer.setdefault(name, []).append(score)
    return {
        name: {
            "mean": round(_mean(s["score"] for s in scores) or 0.0, 4),
            "count": len(scores),
            "passed": sum(1 for s in scores if s.get("passed")),
        }
        for name, scores in sorted(per_scorer.items())
    }


def _latency(ran: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    latencies = [r["latency_ms"] for r in ran if r.get("latency_ms") is not None]
    mean = _mean(latencies)
    return {
        "p50": percentile(latencies, 50),
        "p95": percentile(latencies, 95),
        "mean": round(mean) if mean is not None else None,
    }


def _count(results: Sequence[Mapping[str, Any]], status: str) -> int:
    return sum(1 for r in results if r["status"] == status)


def experiment_summary(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of an experiment's results.

    Args:
        results: ``[{status, passed, scores, latency_ms, prompt_tokens, completion_tokens,
            cost_usd_micros}]`` (ExperimentResult fields).

    Returns:
        ``{results, scored, passed, failed, errors, skipped, pass_rate, pass_rate_ci95: [low,
        high], scores: {scorer: {mean, count, passed}}, latency_ms: {p50, p95, mean},
        prompt_tokens, completion_tokens, cost_usd}``. The pass rate counts the results that
        ran (scored or errored: a failed run is a failed item); skipped ones are left out.
        ``pass_rate`` is None when nothing ran.
    """
    ran = [r for r in results if r["status"] in ("done", "error")]
    passed = sum(1 for r in ran if r["passed"])
    low, high = wilson_interval(passed, len(ran))
    return {
        "results": len(results),
        "scored": _count(results, "done"),
        "passed": passed,
        "failed": len(ran) - passed,
        "errors": _count(results, "error"),
        "skipped": _count(results, "skipped"),
        "pass_rate": round(passed / len(ran), 4) if ran else None,
        "pass_rate_ci95": [round(low, 4), round(high, 4)],
        "scores": _scorer_means(ran),
        "latency_ms": _latency(ran),
        "prompt_tokens": sum(r.get("prompt_tokens", 0) for r in results),
        "completion_tokens": sum(r.get("completion_tokens", 0) for r in results),
        "cost_usd": round(sum(r.get("cost_usd_micros", 0) for r in results) / 1_000_000, 6),
    }
