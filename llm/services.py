"""Writes for providers and routes."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from llm.models import ModelProvider, ModelRoute, ModelRouteEntry
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
