"""Routing rules: an agent's ordered rules that choose the model route of one turn.

A rule (``AgentInstance.routing_rules``, a JSON list) is::

    {"name": "vision", "route": "vision-route", "images": true}
    {"name": "code", "route": "coder", "regex": "(?i)\\bpython\\b"}
    {"name": "billing", "route": "cheap", "keywords": ["refund", "invoice"]}
    {"name": "long", "route": "long-context", "min_tokens": 20000}
    {"name": "saver", "route": "cheap", "min_budget_share": 0.8}

``route`` names a model route of the agent's own tenant (by name, as versions and agents as
code name routes); every condition given must hold (at least one is needed):

- ``regex``: a regular expression found in the latest user message (the ``regex`` module,
  searched with a :data:`REGEX_TIMEOUT_SECONDS` timeout: a pattern that backtracks for too
  long counts as no match, it cannot stall a worker shared by every tenant);
- ``keywords``: any of the words or phrases occurs in it (case-insensitive);
- ``images``: true: the conversation sent to the model has images; false: it has none;
- ``min_tokens``: the turn's prompt is estimated at this many tokens or more (``llm.tokens``);
- ``min_budget_share``: the run has spent at least this share (0-1) of the agent's
  ``max_cost_per_run_usd`` (never holds when the agent has no cost budget).

The first rule whose conditions hold chooses the route for the turn; none: the agent's own
route. The fallback chain inside the chosen route works as for the agent's route
(:mod:`llm.router`). The runner compiles the rules once per run (:func:`rules_compile`) and
matches them once per model turn (:func:`rule_choose`); an agent without rules costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import regex

RULE_KEYS = frozenset({"name", "route", "regex", "keywords", "images", "min_tokens", "min_budget_share"})
"""Every key a rule may have."""
CONDITION_KEYS = ("regex", "keywords", "images", "min_tokens", "min_budget_share")
"""The keys that are conditions (a rule needs at least one)."""
MAX_RULES = 20
"""Rules per agent, at most."""
REGEX_TIMEOUT_SECONDS = 0.05
"""Longest one rule's regex may search a message; past it the rule does not match."""
MAX_TEXT_CHARS = 20_000
"""The part of the latest user message the ``regex`` and ``keywords`` conditions read."""


@dataclass(frozen=True, slots=True)
class TurnFacts:
    """What a turn's rules are matched against."""

    text: str
    """The latest user message's text ("" when none)."""
    has_images: bool
    """Whether the conversation sent to the model has images."""
    prompt_tokens: int
    """The prompt's estimated tokens (``llm.tokens.estimate_tokens``)."""
    budget_share: float | None
    """Cost spent so far / the agent's per-run cost budget; None: the agent has no cost budget."""


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """One routing rule, ready to match (see the module docstring for the conditions)."""

    name: str
    route: str
    """The chosen route's name (in the agent's tenant)."""
    pattern: Any = None
    """The compiled ``regex`` condition, or None."""
    keywords: tuple[str, ...] = ()
    """Lowercased keywords; () when not a condition."""
    images: bool | None = None
    min_tokens: int | None = None
    min_budget_share: float | None = None

    def matches(self, facts: TurnFacts) -> bool:
        """Whether every condition of the rule holds for ``facts``."""
        if self.images is not None and facts.has_images != self.images:
            return False
        if self.min_tokens is not None and facts.prompt_tokens < self.min_tokens:
            return False
        if self.min_budget_share is not None and (
            facts.budget_share is None or facts.budget_share < self.min_budget_share
        ):
            return False
        text = facts.text[:MAX_TEXT_CHARS]
        if self.keywords:
            lowered = text.lower()
            if not any(k in lowered for k in self.keywords):
                return False
        if self.pattern is not None:
            try:
                return self.pattern.search(text, timeout=REGEX_TIMEOUT_SECONDS) is not None
            except TimeoutError:
                return False
        return True


def _rule_errors(i: int, rule: object) -> list[str]:
    """The shape problems of rule number ``i`` (0-based), without looking routes up."""
    where = f"Rule {i + 1}"
    if not isinstance(rule, dict):
        return [f"{where}: a JSON object."]
    errors = []
    unknown = sorted(set(rule) - RULE_KEYS)
    if unknown:
        errors.append(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(RULE_KEYS))}.")
    if not isinstance(rule.get("name"), str) or not rule["name"].strip():
        errors.append(f"{where}: needs a non-empty string 'name'.")
    if not isinstance(rule.get("route"), str) or not rule["route"]:
        errors.append(f"{where}: needs 'route', the name of one of this tenant's model routes.")
    if not any(k in rule for k in CONDITION_KEYS):
        errors.append(f"{where}: needs at least one condition ({', '.join(CONDITION_KEYS)}).")
    errors.extend(_condition_errors(where, rule))
    return errors


def _regex_error(rule: dict[str, Any]) -> str:
    pattern = rule.get("regex")
    if "regex" not in rule:
        return ""
    if not isinstance(pattern, str) or not pattern:
        return "'regex' must be a non-empty regular expression."
    try:
        regex.compile(pattern)
    except regex.error as exc:
        return f"'regex' is not a regular expression: {exc}."
    return ""


def _keywords_error(rule: dict[str, Any]) -> str:
    keywords = rule.get("keywords", ["x"])
    if not isinstance(keywords, list) or not keywords or not all(isinstance(k, str) and k.strip() for k in keywords):
        return "'keywords' must be a non-empty list of non-empty strings."
    return ""


def _number_errors(rule: dict[str, Any]) -> list[str]:
    errors = []
    if not isinstance(rule.get("images", True), bool):
        errors.append("'images' must be true or false.")
    tokens = rule.get("min_tokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        errors.append("'min_tokens' must be a whole number of tokens >= 0.")
    share = rule.get("min_budget_share", 0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        errors.append("'min_budget_share' must be a number from 0 to 1.")
    return errors


def _condition_errors(where: str, rule: dict[str, Any]) -> list[str]:
    """The problems of the rule's conditions, each prefixed with ``where``."""
    found = [_regex_error(rule), _keywords_error(rule), *_number_errors(rule)]
    return [f"{where}: {e}" for e in found if e]


def routing_rules_errors(rules: object, *, tenant_id: int | None) -> list[str]:
    """What is wrong with ``rules`` (``[]``: valid): not a list, more than :data:`MAX_RULES`, a
    malformed rule, two rules with one name, or a ``route`` that is not a model route of tenant
    ``tenant_id`` (another tenant's route is reported exactly as a missing one)."""
    if not isinstance(rules, list):
        return ['A JSON list of rules: [{"name": ..., "route": ..., "keywords": [...]}, ...].']
    if len(rules) > MAX_RULES:
        return [f"At most {MAX_RULES} rules."]
    errors = [e for i, rule in enumerate(rules) for e in _rule_errors(i, rule)]
    if errors:
        return errors
    names = [r["name"] for r in rules]
    if len(set(names)) != len(names):
        return ["Two rules have the same name."]
    if tenant_id is not None:
        from llm.models import ModelRoute

        wanted = {r["route"] for r in rules}
        found = set(ModelRoute.all_tenants.filter(tenant_id=tenant_id, name__in=wanted).values_list("name", flat=True))
        errors = [f"Rule {i + 1}: the tenant has no model route {r['route']!r}." for i, r in enumerate(rules)
                  if r["route"] not in found]
    return errors


def rules_compile(rules: list[dict[str, Any]] | None) -> tuple[CompiledRule, ...]:
    """The rules ready to match, in order (malformed ones, as a version saved before a check
    may hold, are left out)."""
    out = []
    for i, rule in enumerate(rules or ()):
        if _rule_errors(i, rule):
            continue
        out.append(CompiledRule(
            name=rule["name"], route=rule["route"],
            pattern=regex.compile(rule["regex"]) if "regex" in rule else None,
            keywords=tuple(k.lower() for k in rule.get("keywords", ())),
            images=rule.get("images"), min_tokens=rule.get("min_tokens"),
            min_budget_share=float(rule["min_budget_share"]) if "min_budget_share" in rule else None,
        ))
    return tuple(out)


def rule_choose(rules: tuple[CompiledRule, ...], facts: TurnFacts) -> CompiledRule | None:
    """The first of ``rules`` that matches ``facts``, or None (the agent's own route)."""
    for rule in rules:
        if rule.matches(facts):
            return rule
    return None
