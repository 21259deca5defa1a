"""The model route of a turn, chosen by the agent's routing rules (:mod:`agents.routing`).

:func:`route_turn` runs in :func:`sessions.runner.turn.prepare` only when the agent has rules
(``RunSpec.routing_rules``; an agent without rules costs nothing per turn). It matches the rules
against the turn's facts (:func:`turn_facts`: the latest user message, whether the conversation
has images, its estimated tokens, the share of the per-run cost budget spent) and, when the
choice differs from the previous turn's, switches the run's state to the chosen route: a spec
with that route's entries (``RunSpec.routes``, loaded once at the claim), its model (made once
per run with ``RunState.model_for``; its fallback chain works as the agent route's does), and
the LLM-call recorder's spec (so each call row names its entry). The choice is recorded on the
run (``Run.routing``: ``[{turn, rule, route}]``; the trace shows it).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from agents.routing import TurnFacts, rule_choose
from llm.tokens import estimate_tokens
from sessions.runner.images import IMAGE_REFERENCE

if TYPE_CHECKING:
    from sessions.runner.spec import RunSpec
    from sessions.runner.turn import RunState

AGENT_ROUTE = ""
"""The key of the agent's own route in ``RunState.route_specs`` / ``route_models``."""


def _latest_text_and_images(rules: tuple[Any, ...], messages: list[Any]) -> tuple[str, bool]:
    """The latest user message's text, and whether a user message has images (looked for only
    when a rule has an ``images`` condition)."""
    users = [m for m in messages if m.role == "user"]
    text = (users[-1].content or "") if users else ""
    wants_images = any(r.images is not None for r in rules)
    return text, wants_images and any(m.images or IMAGE_REFERENCE.search(m.content or "") for m in users)


async def _budget_share(spec: RunSpec, store: Any) -> float | None:
    """The share of the per-run cost budget spent (None: no budget, or no rule asks)."""
    budget = spec.max_cost_per_run_usd_micros
    if not budget or not any(r.min_budget_share is not None for r in spec.routing_rules):
        return None
    used = await store.usage(spec.run_id)
    return used.cost_usd_micros / budget


async def turn_facts(spec: RunSpec, history: Any, store: Any) -> TurnFacts:
    """The facts the rules of ``spec`` are matched against, for the coming turn over ``history``
    (the cost used is read from ``store`` only when a rule needs it and the agent has a cost budget;
    the tokens are estimated only when a rule needs them)."""
    rules = spec.routing_rules
    text, has_images = _latest_text_and_images(rules, history.messages)
    tokens = estimate_tokens(history.messages, ()) if any(r.min_tokens is not None for r in rules) else 0
    return TurnFacts(text=text, has_images=has_images, prompt_tokens=tokens,
                     budget_share=await _budget_share(spec, store))


async def route_turn(state: RunState) -> None:
    """Choose the coming turn's route by the agent's rules and switch ``state`` to it (see the
    module docstring); record the choice when it changed."""
    if AGENT_ROUTE not in state.route_specs:  # the first turn of this attempt: the agent's route as it started
        state.route_specs[AGENT_ROUTE], state.route_models[AGENT_ROUTE] = state.spec, state.model
    base = state.route_specs[AGENT_ROUTE]
    rule = rule_choose(base.routing_rules, await turn_facts(base, state.history, state.store))
    rule_name = rule.name if rule is not None else ""
    if rule_name == state.route_rule:
        return
    key = rule.route if rule is not None else AGENT_ROUTE
    spec = state.route_specs.get(key)
    if spec is None:
        entries, entry_ids = base.routes[key]
        spec = state.route_specs[key] = dataclasses.replace(base, entries=entries, entry_ids=entry_ids, route_name=key)
    model = state.route_models.get(key)
    if model is None:
        model = state.route_models[key] = state.model_for(spec)
    if spec is not state.spec:
        state.current_entry = 0  # an index into the entries of the route that answered last
    state.spec, state.model, state.route_rule = spec, model, rule_name
    state.record.spec = spec
    await state.store.route_choice_save(spec.run_id, turn=state.turn, rule=rule_name, route=spec.route_name)
