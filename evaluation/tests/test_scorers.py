"""The scorers and the summary's statistics: pure functions, no database."""

from __future__ import annotations

import pytest

from evaluation.scorers import (
    InvalidExpectation,
    contains_facts,
    exact_match,
    expected_validate,
    json_schema_valid,
    judge_verdict,
    normalise,
    regex_match,
    score_text,
    scorers_validate,
    semantic_similarity,
    tool_calls_made,
)
from evaluation.summary import experiment_summary, percentile, wilson_interval


@pytest.mark.parametrize(
    ("fact", "answer"),
    [
        ("2.5 MB", "The largest body is 2,5 MB."),
        ("2,5 MB", "the LIMIT: 2.50MB"),
        ("8082", "It listens on port 8,082."),
        ("65534", "programs run as user id 65\u202f534"),
        ("1,000", "about 1000 tokens"),
        ("Asia/Tokyo", "the zone asia tokyo"),
        ("São Paulo", "SÃO  PAULO!"),
        ("1.2.10", "version v1.2.10 is current"),
    ],
)
def test_facts_are_found_whatever_their_writing(fact, answer):
    assert contains_facts(answer, [fact]).passed, (normalise(fact), normalise(answer))


@pytest.mark.parametrize(
    ("fact", "answer"),
    [
        ("120", "a user may search 1200 times a minute"),
        ("8082", "it listens on 8081"),
        ("2.5 MB", "25 MB"),
        ("1.2.1", "1.2.10"),
        ("65534", "user id 1 and 65 534 others"),  # a plain space separates two numbers
    ],
)
def test_near_misses_are_not_facts(fact, answer):
    assert not contains_facts(answer, [fact]).passed, (normalise(fact), normalise(answer))


def test_facts_score_is_the_share_found_and_names_the_missing():
    score = contains_facts("port 8082, 120 searches", ["8082", "120", "2.5 MB"])
    assert score.score == pytest.approx(2 / 3) and not score.passed
    assert "'2.5 MB'" in score.detail and "2/3" in score.detail


def test_a_fact_given_as_alternatives_is_found_by_any_one_of_them():
    day = ["86400", "24 h", "24 hours"]
    assert contains_facts("Approvals expire after 24 h by default.", [day]).passed
    assert contains_facts("APPROVAL_TTL_SECONDS is 86,400.", [day, "APPROVAL_TTL_SECONDS"]).passed
    missing = contains_facts("They expire after 12 hours.", [day, "12"])
    assert missing.score == pytest.approx(1 / 2) and not missing.passed
    assert "'86400' or '24 h' or '24 hours'" in missing.detail
    assert not contains_facts("after 240 h", [day]).passed  # still on word boundaries


def test_exact_match_ignores_case_and_spacing_only():
    assert exact_match("  Paris\n", "paris").passed
    assert not exact_match("Paris.", "Paris").passed


def test_regex_searches_and_reports_a_bad_pattern():
    assert regex_match("It is 14:05 in Tokyo", r"\b\d{2}:\d{2}\b").passed
    assert not regex_match("no time", r"\d{2}:\d{2}").passed
    bad = regex_match("x", "(")
    assert not bad.passed and "invalid regex" in bad.detail


def test_json_schema_accepts_a_fenced_answer_and_names_the_error():
    schema = {"type": "object", "required": ["port"], "properties": {"port": {"type": "integer"}}}
    assert json_schema_valid('```json\n{"port": 8082}\n```', schema).passed
    wrong = json_schema_valid('{"port": "8082"}', schema)
    assert not wrong.passed and wrong.detail.startswith("port:")
    assert "not JSON" in json_schema_valid("port 8082", schema).detail


def test_tool_calls_match_by_name_and_argument_subset():
    calls = [
        {"name": "get_time", "arguments": {"tz": "Asia/Tokyo", "format": "24h"}},
        {"name": "search", "arguments": {"q": "x", "opts": {"k": 5, "lang": "en"}}},
    ]
    assert tool_calls_made(calls, [{"name": "get_time", "arguments_subset": {"tz": "Asia/Tokyo"}}]).passed
    assert tool_calls_made(calls, [{"name": "search", "arguments_subset": {"opts": {"k": 5}}}]).passed
    half = tool_calls_made(
        calls, [{"name": "get_time", "arguments_subset": {"tz": "Europe/Paris"}}, {"name": "search"}]
    )
    assert half.score == 0.5 and not half.passed and "get_time" in half.detail
    assert not tool_calls_made([], [{"name": "get_time"}]).passed


def test_semantic_similarity_is_the_cosine_against_a_threshold():
    assert semantic_similarity([1.0, 0.0], [1.0, 0.0], threshold=0.8).passed
    orthogonal = semantic_similarity([1.0, 0.0], [0.0, 1.0], threshold=0.8)
    assert orthogonal.score == 0 and not orthogonal.passed
    assert semantic_similarity([0.6, 0.8], [0.8, 0.6], threshold=0.9).score == pytest.approx(0.96)


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ('{"score": 0.8, "reason": "close"}', 0.8),
        ('Here you go: {"score": 1, "reason": "right"} done', 1.0),
        ("Score: 4/5 — mostly right", 0.8),
        ("score = 7", 0.7),
        ("I cannot tell", 0.0),
    ],
)
def test_the_judges_answer_is_read_as_a_score(answer, score):
    verdict = judge_verdict(answer, threshold=0.75)
    assert verdict.score == pytest.approx(score)
    assert verdict.passed == (score >= 0.75)


def test_score_text_applies_only_what_the_item_expects():
    expected = {"reference": "Port 8082", "facts": ["8082"]}
    assert score_text({"type": "facts"}, "8082", expected, []).passed
    assert score_text({"type": "exact_match"}, "8082", expected, []) is None  # facts given: not word for word
    assert score_text({"type": "regex"}, "8082", expected, []) is None
    assert score_text({"type": "exact_match"}, "port 8082", {"reference": "Port 8082"}, []).passed


def test_expected_and_scorers_are_validated_with_reasons():
    assert expected_validate({"facts": ["a"], "tool_calls": [{"name": "t"}]})
    assert expected_validate({"facts": ["a", ["86400", "24 h"]]})
    for bad, words in [
        ({"fact": ["a"]}, "unknown keys"),
        ({"facts": "a"}, "list"),
        ({"facts": [[]]}, "alternatives"),
        ({"facts": [["24 h", " "]]}, "alternatives"),
        ({"facts": [[["nested"]]]}, "alternatives"),
        ({"regex": "("}, "compile"),
        ({"json_schema": {"type": 5}}, "JSON Schema"),
        ({"tool_calls": [{}]}, "name"),
    ]:
        with pytest.raises(InvalidExpectation, match=words):
            expected_validate(bad)
    assert [s["type"] for s in scorers_validate([])] == ["exact_match", "facts", "regex", "json_schema", "tool_calls"]
    assert scorers_validate(["facts", {"type": "semantic"}])[1]["threshold"] == 0.8
    for bad, words in [
        ([{"type": "bleu"}], "type must be"),
        (["facts", "facts"], "twice"),
        ([{"type": "llm_judge", "rubric": "r"}], "route"),
        ([{"type": "llm_judge", "route": 1}], "rubric"),
        ([{"type": "semantic", "threshold": 2}], "threshold"),
    ]:
        with pytest.raises(InvalidExpectation, match=words):
            scorers_validate(bad)


def test_wilson_interval_matches_published_values():
    # Newcombe (1998), Statistics in Medicine 17, Table I: 81/263 → 0.2553-0.3662 (Wilson score);
    # 15/148 → 0.0624-0.1605; 0/20 → 0-0.1611.
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert wilson_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=5e-5)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_percentiles_by_nearest_rank():
    assert percentile([4, 1, 3, 2], 50) == 2
    assert percentile(list(range(1, 21)), 95) == 19
    assert percentile([7], 95) == 7
    assert percentile([], 50) is None


def test_summary_counts_errors_as_failures_and_leaves_skipped_out():
    def row(status, passed, latency=None, cost=0, scores=None):
        return {
            "status": status,
            "passed": passed,
            "scores": scores or {},
            "latency_ms": latency,
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "cost_usd_micros": cost,
        }

    summary = experiment_summary(
        [
            row("done", True, 100, 1000, {"facts": {"score": 1.0, "passed": True}}),
            row("done", False, 300, 1000, {"facts": {"score": 0.5, "passed": False}, "semantic": {"skipped": "none"}}),
            row("error", False, 200, 500),
            row("skipped", None),
        ]
    )
    assert summary["pass_rate"] == pytest.approx(1 / 3, abs=1e-4)
    assert (summary["passed"], summary["failed"], summary["errors"], summary["skipped"]) == (1, 2, 1, 1)
    assert summary["scores"] == {"facts": {"mean": 0.75, "count": 2, "passed": 1}}
    assert summary["latency_ms"]["p50"] == 200 and summary["latency_ms"]["p95"] == 300
    assert summary["cost_usd"] == 0.0025 and summary["prompt_tokens"] == 40
