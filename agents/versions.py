"""Agent versions: immutable snapshots of an agent's configuration, publish and rollback.

The configuration (:func:`agent_config`) is every concrete field of :class:`AgentInstance`
but its identity and bookkeeping (:data:`AGENT_EXCLUDED`), the route by name with a copy of
its entries (``route_entries``: model, position, limits, timeouts, prices, each entry's
provider by name), and the enabled-or-not bindings, each by its capability's name (an MCP
server, CLI command or skill is named, never copied: their secrets stay with them; so does a
provider's key and base URL). Its content hash is the sha256 of its canonical JSON (sorted
keys, no spaces).

The route's entries are pinned: an edit of the route's entries (its fallback chain) records a
new version of every agent on that route (the signals), so a published version keeps running
the entries it was published with, and a rollback brings back the entries of that version
(:func:`version_route_entries`). Providers stay shared by name: a changed key or base URL
reaches every version at once.

Every saved change of an agent or of one of its bindings records a version when the
content hash differs from the agent's latest (:func:`version_record`, run by the signals
of :mod:`agents.signals`); several writes inside :func:`versions_batch` record one. The
latest version is the **draft**; ``AgentInstance.published_version`` is what the chat app,
the APIs and schedules run. An agent never published (None) follows its draft, so an agent
runs as saved until someone publishes a version: the first publish (or rollback) pins it. A run resolves its version
once, when it is created (:func:`run_version_id`), and the runner reads that snapshot once
at the claim (``sessions.runner.database``).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import difflib
import hashlib
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from django.db import models, transaction

from agents.models import AgentInstance, AgentVersion, CapabilityBinding
from guardrails.specs import agent_guardrails_config
from llm.models import ModelProvider, ModelRouteEntry

AGENT_EXCLUDED = frozenset({"id", "tenant", "created_at", "updated_at", "published_version", "draft_version"})
"""AgentInstance fields that are not configuration."""
BINDING_EXCLUDED = frozenset({"id", "tenant", "agent", "created_at"})
"""CapabilityBinding fields that are not configuration."""
ENTRY_EXCLUDED = frozenset({"id", "tenant", "route", "created_at", "updated_at"})
"""ModelRouteEntry fields that are not configuration (the route is the agent's ``route``)."""


def _value(field: models.Field, obj: models.Model) -> Any:
    """A field's value as JSON: a foreign key by its target's ``name`` (None when unset), a
    Decimal as its string."""
    if field.is_relation:
        target_id = getattr(obj, field.attname)
        if target_id is None:
            return None
        return getattr(obj, field.name).name
    value = getattr(obj, field.attname)
    if isinstance(value, Decimal):
        return str(value)
    return value


def config_fields(model: type[models.Model], excluded: frozenset[str]) -> list[models.Field]:
    """The concrete configuration fields of ``model`` (all but ``excluded``), in model order."""
    return [f for f in model._meta.concrete_fields if f.name not in excluded]


def binding_config(binding: CapabilityBinding) -> dict[str, Any]:
    """One binding's configuration: ``{kind, enabled, mcp_server: name, ..., config, ...}``."""
    return {f.name: _value(f, binding) for f in config_fields(type(binding), BINDING_EXCLUDED)}


def agent_config(agent: AgentInstance, bindings: list[CapabilityBinding] | None = None) -> dict[str, Any]:
    """The agent's configuration as JSON: its fields (:data:`AGENT_EXCLUDED` left out), ``route``
    by name and ``bindings`` (each :func:`binding_config`, in binding id order), and ``guardrails``
    when it has any (:func:`guardrails.specs.guardrail_config`, in run order).

    ``bindings``: the agent's bindings if already read (else read here, across tenants by the
    agent's tenant id).
    """
    data = {f.name: _value(f, agent) for f in config_fields(type(agent), AGENT_EXCLUDED)}
    if bindings is None:
        bindings = list(
            type(agent)
            .bindings.rel.related_model.all_tenants.filter(agent_id=agent.pk, tenant_id=agent.tenant_id)
            .order_by("id")
        )
    data["bindings"] = [binding_config(b) for b in bindings]
    guardrails = agent_guardrails_config(agent.pk, agent.tenant_id) if agent.pk else []
    if guardrails:  # (absent when none: the versions of agents without guardrails keep their hash)
        data["guardrails"] = guardrails
    data["route_entries"] = route_entries_config(agent)
    return data


def route_entries_config(agent: Any, *, entry_model: type[models.Model] | None = None) -> list[dict[str, Any]]:
    """The entries of the agent's route in order (position, id), each ``{provider: name, model,
    position, ...}`` (:data:`ENTRY_EXCLUDED` left out). ``entry_model``: the ModelRouteEntry
    model to read (a migration's historical one; default the live one)."""
    model = entry_model if entry_model is not None else ModelRouteEntry
    if agent.route_id is None:
        return []
    entries = (model._default_manager.filter(route_id=agent.route_id, tenant_id=agent.tenant_id)
               .select_related("provider").order_by("position", "id"))
    fields = config_fields(model, ENTRY_EXCLUDED)
    return [{f.name: _value(f, e) for f in fields} for e in entries]


def version_route_entries(version: AgentVersion, *, tenant_id: int,
                          live_entries: list[ModelRouteEntry]) -> list[ModelRouteEntry] | None:
    """The route entries ``version`` pinned, as unsaved ModelRouteEntry rows with their provider
    (found by name in the tenant) attached, in order; each takes the id of the live entry of the
    same provider and model (``live_entries``) so LLM calls keep naming it. An entry whose
    provider no longer exists is left out. None: the version pinned none (recorded before
    route entries were pinned; the route's live entries apply)."""
    pinned = version.config.get("route_entries")
    if pinned is None:
        return None
    providers = {p.name: p for p in ModelProvider.all_tenants.filter(
        tenant_id=tenant_id, name__in=[e.get("provider") for e in pinned])}
    live = {(e.provider_id, e.model): e.pk for e in live_entries}
    entries = []
    for data in pinned:
        provider = providers.get(data.get("provider"))
        if provider is None:
            continue
        entry = ModelRouteEntry(tenant_id=tenant_id)
        for field in config_fields(ModelRouteEntry, ENTRY_EXCLUDED):
            if field.name in data and not field.is_relation:
                setattr(entry, field.attname, field.to_python(data[field.name]))
        entry.provider = provider
        entry.pk = live.get((provider.pk, entry.model))
        entries.append(entry)
    return entries


def content_hash(config: dict[str, Any]) -> str:
    """sha256 (hex) of ``config``'s canonical JSON (sorted keys, ``,``/``:`` separators)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


_batch: contextvars.ContextVar[dict[int, tuple[Any, str]] | None] = contextvars.ContextVar(
    "agent_versions_batch", default=None
)


@contextlib.contextmanager
def versions_batch(*, user: Any = None, note: str = "") -> Iterator[None]:
    """Record one version per changed agent for all the writes inside (a console form with its
    binding rows, an import), by ``user`` with ``note``, when the block ends without error."""
    if _batch.get() is not None:
        yield
        return
    pending: dict[int, tuple[Any, str]] = {}
    token = _batch.set(pending)
    try:
        yield
    finally:
        _batch.reset(token)
    for agent_id in pending:
        agent = AgentInstance.all_tenants.filter(pk=agent_id).first()
        if agent is not None:
            version_record(agent, user=user, note=note)


def agent_changed(agent_id: int) -> None:
    """A write of the agent ``agent_id`` or of one of its bindings (the signals): record a
    version now, or when the current :func:`versions_batch` ends."""
    pending = _batch.get()
    if pending is not None:
        pending[agent_id] = (None, "")
        return
    agent = AgentInstance.all_tenants.filter(pk=agent_id).first()
    if agent is not None:
        version_record(agent)


@transaction.atomic
def version_record(agent: AgentInstance, *, user: Any = None, note: str = "") -> AgentVersion | None:
    """Record the agent's current configuration as its next version, unless its content hash
    is the latest version's (then None). Sets ``draft_version``; ``published_version`` is left
    alone (an agent never published follows its draft: each new version is what runs)."""
    config = agent_config(agent)
    digest = content_hash(config)
    list(AgentInstance.all_tenants.select_for_update().filter(pk=agent.pk).values_list("pk", flat=True))  # lock
    latest = AgentVersion.all_tenants.filter(agent_id=agent.pk).order_by("-number").first()
    if latest is not None and latest.content_hash == digest:
        return None
    version = AgentVersion.all_tenants.create(
        tenant_id=agent.tenant_id,
        agent_id=agent.pk,
        number=(latest.number + 1) if latest else 1,
        content_hash=digest,
        config=config,
        note=note[:500],
        created_by=user if getattr(user, "pk", None) else None,
    )
    AgentInstance.all_tenants.filter(pk=agent.pk).update(draft_version=version)
    agent.draft_version = version
    return version


class VersionError(Exception):
    """A publish or rollback that cannot be done (no such version); ``str()`` says why."""


@transaction.atomic
def version_publish(
    agent: AgentInstance, *, number: int | None = None, user: Any = None, note: str = ""
) -> AgentVersion:
    """Publish version ``number`` of the agent (None: its draft, the latest version): new runs
    of the chat app, the APIs and schedules use it. ``note`` is kept on the version when it
    has none.

    Raises:
        VersionError: the agent has no such version.
    """
    versions = AgentVersion.all_tenants.filter(agent_id=agent.pk, tenant_id=agent.tenant_id)
    version = (versions.filter(number=number) if number is not None else versions.order_by("-number")).first()
    if version is None:
        raise VersionError(
            f"Agent {agent.name!r} has no version {number}."
            if number is not None
            else f"Agent {agent.name!r} has no version yet."
        )
    if note and not version.note:
        AgentVersion.all_tenants.filter(pk=version.pk).update(note=note[:500])
        version.note = note[:500]
    AgentInstance.all_tenants.filter(pk=agent.pk).update(published_version=version)
    agent.published_version = version
    return version


def version_rollback(agent: AgentInstance, *, number: int, user: Any = None) -> AgentVersion:
    """Publish the earlier version ``number`` again (the draft is left as it is).

    Raises:
        VersionError: the agent has no such version.
    """
    return version_publish(agent, number=number, user=user)


def run_version_id(agent: AgentInstance, *, pinned: int | None = None, draft: bool = False) -> int | None:
    """The version a new run of ``agent`` uses: ``pinned`` (a version's number, ``slug@n``), the
    draft (``draft``: the console's playground), else the published one (else the draft).

    Raises:
        VersionError: ``pinned`` is not a version of the agent.
    """
    if pinned is not None:
        found = (
            AgentVersion.all_tenants.filter(agent_id=agent.pk, tenant_id=agent.tenant_id, number=pinned)
            .values_list("pk", flat=True)
            .first()
        )
        if found is None:
            raise VersionError(f"Agent {agent.slug!r} has no version {pinned}.")
        return found
    if draft:
        return agent.draft_version_id
    return agent.published_version_id or agent.draft_version_id


_run_pin: contextvars.ContextVar[tuple[int | None, bool]] = contextvars.ContextVar(
    "agent_run_pin", default=(None, False)
)


@contextlib.contextmanager
def run_pin(*, number: int | None = None, draft: bool = False) -> Iterator[None]:
    """Inside: new runs use version ``number`` of their agent, or its draft (``draft``)."""
    token = _run_pin.set((number, draft))
    try:
        yield
    finally:
        _run_pin.reset(token)


def run_version_for(agent: AgentInstance) -> int | None:
    """:func:`run_version_id` under the current :func:`run_pin` (what ``run_create`` records)."""
    number, draft = _run_pin.get()
    return run_version_id(agent, pinned=number, draft=draft)


def split_pinned_slug(model: str) -> tuple[str, int | None]:
    """``"slug@3"`` → ``("slug", 3)``; ``"slug"`` → ``("slug", None)``; a suffix that is not a
    positive integer stays part of the slug (and so matches no agent)."""
    slug, sep, number = model.rpartition("@")
    if sep and number.isdigit() and int(number) > 0 and slug:
        return slug, int(number)
    return model, None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False, indent=1)


def config_diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per field that differs: ``{field, before, after, diff}`` (``diff``: a unified diff of the
    two values' text, lines), bindings compared as one field, in sorted field order."""
    out = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        lines = list(difflib.unified_diff(_text(a).splitlines(), _text(b).splitlines(), "before", "after", lineterm=""))
        out.append({"field": name, "before": a, "after": b, "diff": lines})
    return out


def _named(field: models.Field, tenant_id: int, name: Any) -> Any:
    """The tenant's row of ``field``'s target model called ``name`` (None: none, or no name)."""
    if name is None:
        return None
    return field.related_model.all_tenants.filter(tenant_id=tenant_id, name=name).first()


def binding_from_config(data: dict[str, Any], *, agent: AgentInstance) -> CapabilityBinding | None:
    """An unsaved binding of ``agent`` made from :func:`binding_config`'s JSON, each capability
    found by name in the agent's tenant (None: a named capability no longer exists)."""
    binding = CapabilityBinding(tenant_id=agent.tenant_id, agent=agent)
    for field in config_fields(CapabilityBinding, BINDING_EXCLUDED):
        if field.name not in data:
            continue
        value = data[field.name]
        if field.is_relation:
            target = _named(field, agent.tenant_id, value)
            if value is not None and target is None:
                return None
            setattr(binding, field.name, target)
        else:
            setattr(binding, field.attname, value)
    return binding


def _identity(binding: CapabilityBinding) -> tuple[Any, ...]:
    return (
        binding.kind,
        binding.builtin_name,
        *(getattr(binding, f.attname) for f in config_fields(CapabilityBinding, BINDING_EXCLUDED) if f.is_relation),
    )


def version_materialize(
    version: AgentVersion, agent: AgentInstance, live_bindings: list[CapabilityBinding]
) -> tuple[AgentInstance, list[CapabilityBinding]]:
    """What a run of ``version`` runs: a copy of ``agent`` (never saved) with the version's field
    values and route, and its enabled bindings (unsaved; each takes the id of the live binding
    with the same kind and capability, so approvals and traces keep naming it). A binding whose
    capability was deleted since is left out; so is the route when it is gone (the live one
    stays). One read per named capability and one for the route, once per run."""
    config = version.config
    pinned = copy.copy(agent)
    for field in config_fields(AgentInstance, AGENT_EXCLUDED):
        if field.name not in config:
            continue
        if field.is_relation:
            if config[field.name] is not None:
                target = _named(field, agent.tenant_id, config[field.name])
                if target is not None:
                    setattr(pinned, field.name, target)
        else:
            setattr(pinned, field.attname, field.to_python(config[field.name]))
    by_identity = {_identity(b): b.pk for b in live_bindings}
    bindings = []
    for data in config.get("bindings", []):
        if not data.get("enabled", True):
            continue
        binding = binding_from_config(data, agent=pinned)
        if binding is not None:
            binding.pk = by_identity.get(_identity(binding))
            bindings.append(binding)
    return pinned, bindings
