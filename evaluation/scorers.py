"""Scorers: small pure functions that compare an answer with what a dataset item expects.

Each returns a :class:`Score` (``score`` in 0..1, ``passed``, a short ``detail`` for people)
or None when the item expects nothing the scorer can check (then it does not count). The
two that need a model (semantic similarity, the LLM judge) are pure here too: they take the
vectors or the judge's answer; :mod:`evaluation.scoring` calls the embedder and the judge.

Scorer configurations (``Experiment.scorers``, :func:`scorers_validate`)::

    [{"type": "exact_match"}, {"type": "facts"}, {"type": "regex"}, {"type": "json_schema"},
     {"type": "tool_calls"}, {"type": "semantic", "threshold": 0.8},
     {"type": "llm_judge", "route": 3, "rubric": "...", "threshold": 0.7}]
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import SchemaError


@dataclass(frozen=True, slots=True)
class Score:
    """One scorer's verdict on one answer."""

    score: float
    """0..1 (1: fully right)."""
    passed: bool
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"score": round(self.score, 4), "passed": self.passed, "detail": self.detail}


SCORER_TYPES = ("exact_match", "facts", "regex", "json_schema", "tool_calls", "semantic", "llm_judge")
DEFAULT_SCORERS: tuple[dict[str, Any], ...] = (
    {"type": "exact_match"},
    {"type": "facts"},
    {"type": "regex"},
    {"type": "json_schema"},
    {"type": "tool_calls"},
)
"""Used when an experiment names none: each scores the items that expect what it checks.
``exact_match`` scores an item only when it expects a ``reference`` and no ``facts``."""

MAX_REGEX_CHARS = 1000
EXPECTED_KEYS = ("reference", "facts", "regex", "json_schema", "tool_calls")


# --- normalising text -------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_DIGIT_GROUPING = re.compile(r"(?<=\d)['\u00a0\u202f\u2009](?=\d{3}(?!\d))")
"""An apostrophe or a no-break/thin space between digits followed by exactly three more: a
thousands separator ("1'000", "65\u202f534"); removed before NFKC turns those spaces into plain
ones (a plain space between numbers is left alone: "8082 120" is two numbers)."""


def _ungrouped(token: str) -> str | None:
    """``token`` (digits with ``,`` and/or ``.`` marks) with its grouping marks removed and a
    ``.`` as decimal mark, or None when it is not one number (a version, "1.2.10")."""
    if "," in token and "." in token:
        decimal_mark = "," if token.rfind(",") > token.rfind(".") else "."
        grouping = "." if decimal_mark == "," else ","
        return token.replace(grouping, "").replace(decimal_mark, ".")
    mark = "," if "," in token else "."
    groups = token.split(mark)
    if len(groups) == 1:
        return token
    threes = all(len(g) == 3 for g in groups[1:])
    if threes and (len(groups) > 2 or (mark == "," and len(groups[0]) <= 3)):
        return "".join(groups)
    return ".".join(groups) if len(groups) == 2 else None


def _number_canonical(token: str) -> str:
    """A number as written ("2,5", "2.50", "1,000") in one form: the same quantity gives the
    same text ("2.5", "1000"). Rules: with both ``,`` and ``.`` the last one is the decimal
    mark; a lone kind of mark between groups of exactly three digits groups when it appears
    more than once or follows 1-3 digits with a comma ("1,000"), else a single mark is the
    decimal mark ("2,5"); several dots with other groups (a version, "1.2.10") stay as they
    are."""
    plain = _ungrouped(token)
    if plain is None:
        return token
    try:
        return f"{Decimal(plain).normalize():f}"
    except InvalidOperation:
        return token


def normalise(text: str) -> str:
    """``text`` for fact matching: Unicode NFKC, casefolded, numbers in one form
    (:func:`_number_canonical`), digits and letters split apart ("2.5MB" → "2.5 mb"), every
    other punctuation a space, whitespace collapsed. "The limit is 2,5 MB." and "the LIMIT:
    2.50MB" both give "... 2.5 mb"."""
    text = unicodedata.normalize("NFKC", _DIGIT_GROUPING.sub("", str(text))).casefold()
    text = _NUMBER.sub(lambda m: f" {_number_canonical(m.group(0))} ", text)
    text = re.sub(r"(?<=[^\W\d_])(?=\d)|(?<=\d)(?=[^\W\d_])", " ", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)|[^\w.]|_", " ", text)
    return " ".join(text.split())


def _contains(haystack: str, needle: str) -> bool:
    """Whether normalised ``needle`` occurs in normalised ``haystack`` on word boundaries
    ("120" is not in "1200")."""
    return bool(needle) and f" {needle} " in f" {haystack} "


Fact = str | Sequence[str]
"""An expected fact: a string, or a list of alternatives any one of which counts
(``["86400", "24 h", "24 hours"]``: a default given in seconds or in hours)."""


def fact_alternatives(fact: Fact) -> list[str]:
    """The strings that count for ``fact``: itself, or its alternatives."""
    return [fact] if isinstance(fact, str) else list(fact)


def fact_in(normalised_text: str, fact: Fact) -> bool:
    """Whether ``fact`` (one of its alternatives) occurs in ``normalised_text`` (already
    :func:`normalise`d), normalised, on word boundaries."""
    return any(_contains(normalised_text, normalise(a)) for a in fact_alternatives(fact))


# --- the scorers ------------------------------------------------------------------------------


def exact_match(output: str, reference: str) -> Score:
    """1 when the answer is the reference, ignoring case, surrounding and repeated whitespace
    (NFKC-normalised); else 0."""

    def canon(text: str) -> str:
        return " ".join(unicodedata.normalize("NFKC", text).casefold().split())

    same = canon(output) == canon(reference)
    return Score(1.0 if same else 0.0, same, "" if same else "differs from the reference")


def contains_facts(output: str, facts: Sequence[Fact]) -> Score:
    """The share of ``facts`` found in the answer, both normalised (:func:`normalise`: case,
    punctuation, whitespace, number formats such as "2,5 MB" / "2.5 MB" / "2.50MB"), on word
    boundaries; a fact given as a list is found when any of its alternatives is. Passes when
    every fact is found; ``detail`` names the missing ones."""
    if not facts:
        return Score(1.0, True, "no facts expected")
    text = normalise(output)
    missing = [fact for fact in facts if not fact_in(text, fact)]
    found = len(facts) - len(missing)
    named = [" or ".join(repr(a) for a in fact_alternatives(f)) for f in missing]
    detail = f"{found}/{len(facts)} facts" + (f"; missing: {', '.join(named)}" if missing else "")
    return Score(found / len(facts), not missing, detail)


def regex_match(output: str, pattern: str) -> Score:
    """1 when ``pattern`` (Python ``re`` syntax, searched anywhere, inline flags such as
    ``(?i)`` allowed) matches the answer; else 0. A pattern that does not compile scores 0
    with the error as detail."""
    try:
        found = re.search(pattern, output) is not None
    except re.error as exc:
        return Score(0.0, False, f"invalid regex: {exc}")
    return Score(1.0 if found else 0.0, found, "" if found else f"no match for {pattern!r}")


_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)


def json_schema_valid(output: str, schema: Mapping[str, Any]) -> Score:
    """1 when the answer is JSON (a Markdown code fence around it is allowed) that is valid
    against ``schema`` (the schema's own ``$schema`` draft, else Draft 2020-12); else 0 with
    the first error."""
    fenced = _FENCE.match(output)
    try:
        value = json.loads(fenced.group(1) if fenced else output)
    except ValueError as exc:
        return Score(0.0, False, f"not JSON: {exc}")
    try:
        validator_class = validators.validator_for(schema)
        validator_class.check_schema(schema)
    except SchemaError as exc:
        return Score(0.0, False, f"invalid schema: {exc.message}")
    error = next(iter(validator_class(schema).iter_errors(value)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return Score(0.0, False, f"{where}: {error.message}")
    return Score(1.0, True)


def _is_subset(subset: Any, value: Any) -> bool:
    """Whether ``subset`` is contained in ``value``: objects key by key (recursively), other
    values equal (numbers by value: 1 == 1.0)."""
    if isinstance(subset, Mapping):
        return isinstance(value, Mapping) and all(k in value and _is_subset(v, value[k]) for k, v in subset.items())
    return subset == value


def tool_calls_made(calls: Sequence[Mapping[str, Any]], expected: Sequence[Mapping[str, Any]]) -> Score:
    """The share of ``expected`` calls (``{name, arguments_subset}``) the run made: a call of
    that name whose arguments contain the subset (:func:`_is_subset`). ``calls``: the run's
    tool calls, ``[{name, arguments}]`` (ToolCall rows). Passes when every expected call was
    made; order and extra calls do not matter."""
    if not expected:
        return Score(1.0, True, "no tool calls expected")
    missing = [
        want
        for want in expected
        if not any(
            c.get("name") == want.get("name")
            and _is_subset(want.get("arguments_subset") or {}, c.get("arguments") or {})
            for c in calls
        )
    ]
    made = len(expected) - len(missing)
    names = ", ".join(str(m.get("name")) for m in missing)
    return Score(
        made / len(expected), not missing, f"{made}/{len(expected)} calls" + (f"; not made: {names}" if missing else "")
    )


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of the angle between ``a`` and ``b`` (0.0 when either is all zeros)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def semantic_similarity(
    output_vector: Sequence[float], reference_vector: Sequence[float], *, threshold: float
) -> Score:
    """The cosine similarity of the answer's and the reference's embeddings (clamped to 0..1);
    passes at ``threshold`` or above."""
    similarity = max(0.0, min(1.0, cosine_similarity(output_vector, reference_vector)))
    return Score(similarity, similarity >= threshold, f"cosine {similarity:.3f} (threshold {threshold})")


_JUDGE_JSON = re.compile(r"\{[^{}]*\}", re.DOTALL)
_JUDGE_SCORE = re.compile(r"score\W{0,3}(\d+(?:\.\d+)?)\s*(?:/\s*(\d+))?", re.IGNORECASE)


def judge_verdict(answer: str, *, threshold: float) -> Score:
    """The LLM judge's answer read as a score: a JSON object ``{"score": 0..1, "reason": ...}``
    anywhere in it, else a line ``score: 0.8`` or ``score: 4/5``. Scores above 1 without a
    denominator are read out of 10 when ≤ 10, else out of 100. Passes at ``threshold`` or
    above. An answer with no score scores 0 (detail: the judge's text, cut)."""
    reason = ""
    value: float | None = None
    for candidate in _JUDGE_JSON.findall(answer):
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("score"), int | float):
            value, reason = float(parsed["score"]), str(parsed.get("reason", ""))
            break
    if value is None:
        match = _JUDGE_SCORE.search(answer)
        if match is None:
            return Score(0.0, False, f"the judge gave no score: {answer[:200]!r}")
        value = float(match.group(1)) / (float(match.group(2)) if match.group(2) else 1.0)
        reason = answer.strip()
    if value > 1:
        value = value / 10 if value <= 10 else value / 100
    value = max(0.0, min(1.0, value))
    return Score(value, value >= threshold, reason[:500])


# --- validation -------------------------------------------------------------------------------


class InvalidExpectation(ValueError):
    """An item's ``expected`` or an experiment's scorer configuration is malformed (the
    message says what and where)."""


def _check_tool_calls(value: Any) -> None:
    if not isinstance(value, list):
        raise InvalidExpectation("expected.tool_calls must be a list of {name, arguments_subset}.")
    for i, call in enumerate(value):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise InvalidExpectation(f"expected.tool_calls[{i}] needs a name (a string).")
        if not isinstance(call.get("arguments_subset", {}), dict):
            raise InvalidExpectation(f"expected.tool_calls[{i}].arguments_subset must be an object.")


def _check_regex(pattern: Any) -> None:
    if not isinstance(pattern, str) or len(pattern) > MAX_REGEX_CHARS:
        raise InvalidExpectation(f"expected.regex must be a string of at most {MAX_REGEX_CHARS} characters.")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InvalidExpectation(f"expected.regex does not compile: {exc}.") from exc


def _check_schema(schema: Any) -> None:
    try:
        validators.validator_for(schema).check_schema(schema)
    except (SchemaError, TypeError, AttributeError) as exc:
        raise InvalidExpectation(f"expected.json_schema is not a valid JSON Schema: {exc}.") from exc


def _valid_fact(fact: Any) -> bool:
    if isinstance(fact, str):
        return bool(fact.strip())
    return isinstance(fact, list) and bool(fact) and all(isinstance(a, str) and a.strip() for a in fact)


def expected_validate(expected: Any) -> dict[str, Any]:
    """``expected`` checked: an object whose keys are among :data:`EXPECTED_KEYS`, ``reference``
    and ``regex`` strings (the regex compiles, ≤ 1,000 characters), ``facts`` a list of
    non-empty strings or of non-empty lists of them (:data:`Fact`), ``json_schema`` a valid JSON Schema, ``tool_calls`` a list of ``{name,
    arguments_subset}``. Returns it unchanged.

    Raises:
        InvalidExpectation: what is wrong.
    """
    if expected is None:
        return {}
    if not isinstance(expected, dict):
        raise InvalidExpectation("expected must be an object.")
    unknown = sorted(set(expected) - set(EXPECTED_KEYS))
    if unknown:
        raise InvalidExpectation(f"expected has unknown keys {unknown}; allowed: {', '.join(EXPECTED_KEYS)}.")
    if "reference" in expected and not isinstance(expected["reference"], str):
        raise InvalidExpectation("expected.reference must be a string.")
    facts = expected.get("facts", [])
    if not isinstance(facts, list) or not all(_valid_fact(f) for f in facts):
        raise InvalidExpectation(
            "expected.facts must be a list of non-empty strings (or of lists of them: alternatives, any one counts).")
    if "regex" in expected:
        _check_regex(expected["regex"])
    if "json_schema" in expected:
        _check_schema(expected["json_schema"])
    if "tool_calls" in expected:
        _check_tool_calls(expected["tool_calls"])
    return expected


def _threshold(config: Mapping[str, Any], default: float, where: str) -> float:
    value = config.get("threshold", default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidExpectation(f"{where}.threshold must be a number from 0 to 1.")
    return float(value)


def scorers_validate(scorers: Any) -> list[dict[str, Any]]:
    """An experiment's scorer list checked and completed with defaults: each a ``{type, ...}``
    (:data:`SCORER_TYPES`; a bare string is its type), each type at most once; ``semantic``
    gets ``threshold`` (default 0.8); ``llm_judge`` needs ``route`` (an id) and ``rubric`` (a
    non-empty string) and gets ``threshold`` (default 0.5). Empty: :data:`DEFAULT_SCORERS`.
    Whether the route is the tenant's is the service's check.

    Raises:
        InvalidExpectation: what is wrong, naming ``scorers[i]``.
    """
    if scorers in (None, []):
        return [dict(s) for s in DEFAULT_SCORERS]
    if not isinstance(scorers, list):
        raise InvalidExpectation("scorers must be a list.")
    checked: list[dict[str, Any]] = []
    for i, raw in enumerate(scorers):
        config = {"type": raw} if isinstance(raw, str) else raw
        where = f"scorers[{i}]"
        if not isinstance(config, dict) or config.get("type") not in SCORER_TYPES:
            raise InvalidExpectation(f"{where}: type must be one of {', '.join(SCORER_TYPES)}.")
        if any(c["type"] == config["type"] for c in checked):
            raise InvalidExpectation(f"{where}: {config['type']} is listed twice.")
        checked.append(_scorer_options(dict(config), where))
    return checked


def _scorer_options(config: dict[str, Any], where: str) -> dict[str, Any]:
    """One scorer's options checked and completed (see :func:`scorers_validate`)."""
    if config["type"] == "semantic":
        config["threshold"] = _threshold(config, 0.8, where)
    elif config["type"] == "llm_judge":
        if isinstance(config.get("route"), bool) or not isinstance(config.get("route"), int):
            raise InvalidExpectation(f"{where}: llm_judge needs route (a model route id).")
        if not isinstance(config.get("rubric"), str) or not config["rubric"].strip():
            raise InvalidExpectation(f"{where}: llm_judge needs a rubric (what a good answer does).")
        config["threshold"] = _threshold(config, 0.5, where)
    return config


def score_text(
    config: Mapping[str, Any], output: str, expected: Mapping[str, Any], tool_calls: Sequence[Mapping[str, Any]]
) -> Score | None:
    """The score of one of the model-free scorers (``exact_match``, ``facts``, ``regex``,
    ``json_schema``, ``tool_calls``) for ``output``, or None when ``expected`` has nothing for
    it (``exact_match`` also stays out when the item lists facts: a fact-checked answer is
    rarely word for word the reference)."""
    kind = config["type"]
    if kind == "exact_match" and "reference" in expected and not expected.get("facts"):
        return exact_match(output, expected["reference"])
    if kind == "facts" and expected.get("facts"):
        return contains_facts(output, expected["facts"])
    if kind == "regex" and "regex" in expected:
        return regex_match(output, expected["regex"])
    if kind == "json_schema" and "json_schema" in expected:
        return json_schema_valid(output, expected["json_schema"])
    if kind == "tool_calls" and expected.get("tool_calls"):
        return tool_calls_made(tool_calls, expected["tool_calls"])
    return None
