"""Agents as code: a tenant's agents as YAML, and back (``manage.py agents_export`` / ``agents_import``).

The document::

    agents:
      - tenant: acme            # the tenant's slug
        slug: helper
        name: Helper
        system_prompt: ...
        route: default          # a model route of the tenant, by name
        ...                     # every configuration field (agents.versions.agent_config)
        bindings:
          - kind: mcp_server
            mcp_server: github  # capabilities by name; their secrets stay with them
            allowed_tools: []
            ...

Importing an agent whose slug the tenant already has changes it (a new version when its
content changed); an unknown slug creates one. Each agent's bindings are replaced by the
document's, and so are its guardrails (``guardrails``; absent: none). Nothing secret is
written: an agent's configuration holds none (routes, MCP
servers, CLI commands and skills are named; their keys and environments are not exported).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction

from agents.models import AgentInstance, CapabilityBinding
from agents.versions import (
    AGENT_EXCLUDED,
    agent_config,
    binding_from_config,
    config_diff,
    config_fields,
    versions_batch,
)
from guardrails.specs import guardrails_replace
from tenants.models import Tenant


def agents_export(
    *, tenant_slug: str | None = None, agent_slug: str | None = None, tenant_ids: list[int] | None = None
) -> str:
    """YAML of the agents (every tenant's, or ``tenant_slug``'s; all, or the one ``agent_slug``;
    ``tenant_ids``: only those tenants', the console's), ordered by tenant then slug."""
    agents = AgentInstance.all_tenants.select_related("tenant", "route").order_by("tenant__slug", "slug")
    if tenant_ids is not None:
        agents = agents.filter(tenant_id__in=tenant_ids)
    if tenant_slug:
        agents = agents.filter(tenant__slug=tenant_slug)
    if agent_slug:
        agents = agents.filter(slug=agent_slug)
    docs = [{"tenant": a.tenant.slug, **agent_config(a)} for a in agents]
    return yaml.safe_dump({"agents": docs}, sort_keys=False, allow_unicode=True, width=120)


class ImportError_(Exception):  # noqa: N801  (ImportError is a builtin)
    """The document cannot be imported; ``str()`` says where and why."""


@dataclass
class ImportPlan:
    """One agent of the document: what importing it changes (``changes``: :func:`config_diff`)."""

    tenant: str
    slug: str
    created: bool
    changes: list[dict[str, Any]] = field(default_factory=list)


def _documents(text: str) -> list[dict[str, Any]]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ImportError_(f"Not YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise ImportError_("Expected a mapping with a list `agents`.")
    for i, doc in enumerate(data["agents"]):
        if not isinstance(doc, dict) or not doc.get("tenant") or not doc.get("slug"):
            raise ImportError_(f"agents[{i}]: needs `tenant` and `slug`.")
        if not isinstance(doc.get("bindings", []), list):
            raise ImportError_(f"agents[{i}]: `bindings` must be a list.")
    return data["agents"]


def _apply(tenant: Tenant, agent: AgentInstance, doc: dict[str, Any]) -> None:
    """Write ``doc`` onto ``agent`` (saved) and replace its bindings.

    Raises:
        ImportError_: a named route or capability the tenant does not have, or invalid values.
    """
    where = f"{tenant.slug}/{doc['slug']}"
    for f in config_fields(AgentInstance, AGENT_EXCLUDED):
        if f.name not in doc:
            continue
        value = doc[f.name]
        if f.is_relation:
            target = f.related_model.all_tenants.filter(tenant_id=tenant.pk, name=value).first()
            if target is None:
                raise ImportError_(f"{where}: the tenant has no {f.name} {value!r}.")
            setattr(agent, f.name, target)
        else:
            setattr(agent, f.attname, f.to_python(value))
    try:
        agent.full_clean()
    except ValidationError as exc:
        raise ImportError_(f"{where}: {exc.message_dict}") from exc
    agent.save()
    CapabilityBinding.all_tenants.filter(agent=agent).delete()
    for i, data in enumerate(doc.get("bindings", [])):
        binding = binding_from_config(data, agent=agent) if isinstance(data, dict) else None
        if binding is None:
            raise ImportError_(f"{where}: bindings[{i}] names a capability the tenant does not have.")
        try:
            binding.full_clean(exclude=["agent", "tenant"])
        except ValidationError as exc:
            raise ImportError_(f"{where}: bindings[{i}]: {exc.message_dict}") from exc
        binding.save()
    guardrails = doc.get("guardrails") or []
    problems = guardrails_replace(agent, guardrails) if isinstance(guardrails, list) else ["`guardrails` must be a list."]
    if problems:
        raise ImportError_(f"{where}: {problems[0]}")


def agents_import(
    text: str,
    *,
    dry_run: bool = False,
    tenant_slug: str | None = None,
    note: str = "Imported",
    user: Any = None,
    tenant_ids: list[int] | None = None,
) -> list[ImportPlan]:
    """Import the YAML ``text`` (:func:`agents_export`'s shape): per agent, its plan (created or
    the fields that change). ``dry_run``: nothing is written. ``tenant_slug``: only that
    tenant's agents of the document. ``tenant_ids``: the tenants the caller may write (the console's
    admin; another tenant is refused as unknown). ``user``: the versions' author. All agents or
    none (one transaction).

    Raises:
        ImportError_: not the expected shape, an unknown tenant, route or capability, or a
            value the model refuses.
    """
    docs = _documents(text)
    with transaction.atomic():
        with versions_batch(note=note, user=user):
            plans = [_import_one(doc, tenant_ids) for doc in docs if not tenant_slug or doc["tenant"] == tenant_slug]
        if dry_run:
            transaction.set_rollback(True)
    return plans


def _import_one(doc: dict[str, Any], tenant_ids: list[int] | None) -> ImportPlan:
    """Import one agent's document (inside :func:`agents_import`'s transaction)."""
    tenant = Tenant.objects.filter(slug=doc["tenant"]).first()
    if tenant is None or (tenant_ids is not None and tenant.pk not in tenant_ids):
        raise ImportError_(f"No tenant {doc['tenant']!r}.")
    agent = AgentInstance.all_tenants.filter(tenant=tenant, slug=doc["slug"]).first()
    before = agent_config(agent) if agent else {}
    plan = ImportPlan(tenant=tenant.slug, slug=doc["slug"], created=agent is None)
    agent = agent or AgentInstance(tenant=tenant)
    _apply(tenant, agent, doc)
    plan.changes = config_diff(before, agent_config(agent))
    return plan


def plans_text(plans: list[ImportPlan]) -> str:
    """A readable report of :func:`agents_import`'s plans (the dry run's output)."""
    lines = []
    for plan in plans:
        state = "new agent" if plan.created else f"{len(plan.changes)} field(s) change" if plan.changes else "unchanged"
        lines.append(f"{plan.tenant}/{plan.slug}: {state}")
        for change in plan.changes:
            lines.append(f"  {change['field']}:")
            lines.extend(f"    {line}" for line in change["diff"][2:])
    return "\n".join(lines) + ("\n" if lines else "")
