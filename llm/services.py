"""Writes for providers and routes, and the route test."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.db import transaction

from llm.config import RouteEntryConfig
from llm.errors import LLMError, ModelCallError
from llm.health import RedisEntryHealth
from llm.models import ModelProvider, ModelRoute, ModelRouteEntry
from llm.router import Router
from llm.selectors import entry_health_key, route_entries, route_entry_config
from llm.types import ChatMessage
from tenants.crypto import secret_encrypt
from tenants.models import Tenant


@transaction.atomic
def provider_save(
    *, tenant: Tenant, provider: ModelProvider | None = None, api_key: str | None = None, **fields: Any
) -> ModelProvider:
    """Create or update a provider. ``api_key=None`` keeps the stored key; "" clears it."""
    provider = provider or ModelProvider(tenant=tenant)
    for name, value in fields.items():
        setattr(provider, name, value)
    if api_key is not None:
        provider.api_key_encrypted = secret_encrypt(tenant=tenant, plaintext=api_key)
    provider.full_clean()
    provider.save()
    return provider


@transaction.atomic
def route_save(
    *, tenant: Tenant, route: ModelRoute | None = None, entries: list[dict[str, Any]] | None = None, **fields: Any
) -> ModelRoute:
    """Create or update a route; ``entries`` (if given) replace the route's entries, in order."""
    route = route or ModelRoute(tenant=tenant)
    for name, value in fields.items():
        setattr(route, name, value)
    route.full_clean()
    route.save()
    if entries is not None:
        ModelRouteEntry.objects.filter(route=route).delete()
        for position, entry in enumerate(entries):
            row = ModelRouteEntry(tenant=tenant, route=route, position=position, **entry)
            row.full_clean()
            row.save()
    return route


ROUTE_TEST_PROMPT = "Reply with the single word: OK"
ROUTE_TEST_MAX_OUTPUT_TOKENS = 8
ROUTE_TEST_ERROR_CHARS = 200
"""The route test reports at most this much of an entry's error (redacted)."""


async def _probe_entry(config: RouteEntryConfig) -> dict[str, Any]:
    router = Router([dataclasses.replace(config, index=0, max_retries=0)])
    started = time.monotonic()
    try:
        completion = await router.complete(
            [ChatMessage(role="user", content=ROUTE_TEST_PROMPT)], [], max_output_tokens=ROUTE_TEST_MAX_OUTPUT_TOKENS
        )
    except LLMError as exc:
        last = getattr(exc, "last_error", None) or (exc if isinstance(exc, ModelCallError) else None)
        return {
            "ok": False, "latency_ms": int((time.monotonic() - started) * 1000),
            # Redacted (ModelCallError) and cut: the route test must not reflect a service's answer.
            "error_class": getattr(last, "error_class", "other"), "error": str(last or exc)[:ROUTE_TEST_ERROR_CHARS],
            "reply": "",
        }
    return {
        "ok": True, "latency_ms": int((time.monotonic() - started) * 1000), "error_class": None, "error": "",
        "reply": completion.message.content[:200],
    }


def route_test(*, route: ModelRoute) -> list[dict[str, Any]]:
    """Send a tiny request through each entry of ``route`` on its own (no retries, no
    fallback, nothing recorded) and report what happened.

    Returns:
        One dict per entry, in route order: ``{entry_id, position, provider, model, ok,
        latency_ms, error_class, error, reply}``. Entries are probed in parallel; each is
        bounded by its own timeouts.

    Requires tenant scope.
    """
    entries = route_entries(route_id=route.pk)
    tenant = Tenant.objects.get(pk=route.tenant_id)
    configs = [route_entry_config(e, tenant=tenant, index=i) for i, e in enumerate(entries)]

    async def probe_all() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_probe_entry(c) for c in configs))

    results = asyncio.run(probe_all())
    return [
        {"entry_id": e.pk, "position": e.position, "provider": e.provider.name, "model": e.model, **result}
        for e, result in zip(entries, results, strict=False)
    ]


def route_health(*, route: ModelRoute) -> list[dict[str, Any]]:
    """Each entry's shared health (cooldown state, last minute's calls and failures).

    Returns:
        ``[{entry_id, position, provider, model, state, cooldown_until, calls_last_minute,
        failures_last_minute, last_error_class}]``; ``cooldown_until`` is an ISO 8601 UTC
        time or None. Requires tenant scope.
    """
    entries = route_entries(route_id=route.pk)

    async def snapshots() -> list[Any]:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            health = RedisEntryHealth(client, prefix=f"{settings.REDIS_KEY_PREFIX}:health")
            return [await health.snapshot(entry_health_key(e.pk)) for e in entries]
        finally:
            await client.aclose()

    out = []
    for entry, snap in zip(entries, asyncio.run(snapshots()), strict=False):
        until = snap.cooldown_until
        out.append({
            "entry_id": entry.pk, "position": entry.position, "provider": entry.provider.name, "model": entry.model,
            "state": snap.state,
            "cooldown_until": datetime.fromtimestamp(until, tz=UTC).isoformat() if until else None,
            "calls_last_minute": snap.calls_last_minute, "failures_last_minute": snap.failures_last_minute,
            "last_error_class": snap.last_error_class,
        })
    return out
