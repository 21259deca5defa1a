"""Reads for routes: entry configurations for the router, and entry health."""

from __future__ import annotations

from llm.config import RouteEntryConfig
from llm.models import ModelRouteEntry
from tenants.crypto import secret_decrypt
from tenants.models import Tenant

KEYLESS_API_KEY = "none"
"""Sent when a provider has no key (local servers): the SDKs refuse an empty one."""


def route_entry_config(entry: ModelRouteEntry, *, tenant: Tenant, index: int) -> RouteEntryConfig:
    """The router's view of one entry, with the provider's key decrypted.

    Args:
        entry: With ``provider`` loaded (select_related).
        tenant: The entry's tenant (its data key decrypts the provider key).
        index: The entry's 0-based position in the list handed to the router.
    """
    provider = entry.provider
    return RouteEntryConfig(
        index=index,
        provider_name=provider.name,
        base_url=provider.base_url,
        api_key=secret_decrypt(tenant=tenant, ciphertext=provider.api_key_encrypted) or KEYLESS_API_KEY,
        model=entry.model,
        max_input_tokens=entry.max_input_tokens,
        max_output_tokens=entry.max_output_tokens,
        connect_timeout_seconds=entry.connect_timeout_seconds,
        read_timeout_seconds=entry.read_timeout_seconds,
        tool_calls=entry.tool_calls,
        api=provider.api,
        first_token_timeout_seconds=entry.first_token_timeout_seconds,
        stream_timeout_seconds=entry.stream_timeout_seconds,
        max_retries=entry.max_retries,
        input_price_per_mtok=float(entry.input_price_per_mtok),
        output_price_per_mtok=float(entry.output_price_per_mtok),
        supports_tools=entry.supports_tools,
        supports_images=entry.supports_images,
        json_schema_mode=entry.json_schema_mode and provider.api == "openai",
        entry_key=entry_health_key(entry.pk),
        temperature=entry.temperature,
    )


def entry_health_key(entry_id: int) -> str:
    """The key of a route entry in the shared health store."""
    return f"entry:{entry_id}"


def route_entries(*, route_id: int) -> list[ModelRouteEntry]:
    """A route's entries in order, providers loaded (tenant scope required)."""
    return list(ModelRouteEntry.objects.filter(route_id=route_id).select_related("provider").order_by("position", "id"))
