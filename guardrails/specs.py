"""An agent's guardrails as configuration: the version snapshot's JSON (:func:`guardrail_config`,
:mod:`agents.versions` and :mod:`agents.as_code`) and what a run applies (:class:`GuardrailSpec`,
from live rows or from a snapshot)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from guardrails.checks import GuardrailSpec
from guardrails.models import Guardrail

CONFIG_FIELDS = ("name", "point", "kind", "position", "enabled", "action", "on_error", "config", "message", "route")
"""The snapshot's keys (``route`` by its name); the row's id, tenant, agent and times are not configuration."""


def guardrail_config(guardrail: Guardrail, route_names: dict[int, str] | None = None) -> dict[str, Any]:
    """One guardrail's configuration as JSON (``route``: the route's name, None when unset).
    ``route_names``: ``{route id: name}`` when already read (else the route is read)."""
    data = {name: getattr(guardrail, name) for name in CONFIG_FIELDS if name != "route"}
    if guardrail.route_id is None:
        data["route"] = None
    elif route_names is not None and guardrail.route_id in route_names:
        data["route"] = route_names[guardrail.route_id]
    else:
        data["route"] = guardrail.route.name
    return data


def agent_guardrails_config(agent_id: int, tenant_id: int) -> list[dict[str, Any]]:
    """The agent's guardrails (enabled or not) as :func:`guardrail_config` JSON, in run order
    (point, position, id); one query."""
    rows = Guardrail.all_tenants.filter(agent_id=agent_id, tenant_id=tenant_id).select_related("route").order_by(
        "point", "position", "id")
    return [guardrail_config(g) for g in rows]


def spec_of(guardrail: Guardrail) -> GuardrailSpec:
    """The run's view of a live row."""
    return GuardrailSpec(name=guardrail.name, point=guardrail.point, kind=guardrail.kind, action=guardrail.action,
                         on_error=guardrail.on_error, config=dict(guardrail.config or {}), message=guardrail.message,
                         route_id=guardrail.route_id)


def specs_of_rows(rows: Iterable[Guardrail]) -> tuple[GuardrailSpec, ...]:
    """The enabled ``rows`` as specs, in run order (point, position, id)."""
    ordered = sorted((g for g in rows if g.enabled), key=lambda g: (g.point, g.position, g.pk or 0))
    return tuple(spec_of(g) for g in ordered)


def specs_of_config(items: Iterable[dict[str, Any]]) -> tuple[GuardrailSpec, ...]:
    """The enabled guardrails of a version's snapshot (``config["guardrails"]``), in their order."""
    specs = []
    for data in items:
        if not data.get("enabled", True):
            continue
        specs.append(GuardrailSpec(
            name=data["name"], point=data["point"], kind=data["kind"], action=data.get("action", "block"),
            on_error=data.get("on_error", "fail_closed"), config=dict(data.get("config") or {}),
            message=data.get("message", ""), route=data.get("route"),
        ))
    return tuple(specs)


def guardrails_replace(agent: Any, items: list[dict[str, Any]]) -> list[str]:
    """Replace ``agent``'s guardrails by ``items`` (:func:`guardrail_config` JSON: an import or a
    restore), each validated. Returns the problems, ``"guardrails[i]: ..."`` (none written then:
    call inside the caller's transaction and roll back on problems).
    """
    from django.core.exceptions import ValidationError

    route_model = Guardrail.route.field.related_model
    problems: list[str] = []
    Guardrail.all_tenants.filter(agent_id=agent.pk, tenant_id=agent.tenant_id).delete()
    for i, data in enumerate(items):
        if not isinstance(data, dict) or not data.get("name"):
            problems.append(f"guardrails[{i}]: needs a `name`.")
            continue
        row = Guardrail(tenant_id=agent.tenant_id, agent=agent)
        for name in CONFIG_FIELDS:
            if name == "route":
                continue
            if name in data:
                setattr(row, name, data[name])
        route_name = data.get("route")
        if route_name:
            route = route_model.all_tenants.filter(tenant_id=agent.tenant_id, name=route_name).first()
            if route is None:
                problems.append(f"guardrails[{i}]: the tenant has no route {route_name!r}.")
                continue
            row.route = route
        try:
            row.full_clean(exclude=["agent", "tenant"])
        except ValidationError as exc:
            problems.append(f"guardrails[{i}]: {exc.message_dict}")
            continue
        row.save()
    return problems
