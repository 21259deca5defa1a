"""The console's provider check: reach a provider and list its models (``GET /v1/models``).

Goes through the llm layer's own SDK clients (``llm.providers.openai_compat`` /
``llm.providers.anthropic``): every connect is checked against the outbound address rules
(``capabilities.netsafe``), the key is the provider's (decrypted with the tenant's data key),
and errors are classified and redacted as for model calls (``llm.errors``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from django.core.cache import cache

from llm.errors import classify_error, redact_secrets
from llm.models import ModelProvider
from llm.providers import sdk_client
from tenants.crypto import secret_decrypt
from tenants.models import Tenant

MAX_MODELS = 500
"""Model ids kept from one listing."""
CACHE_SECONDS = 600
"""How long a successful listing is offered to the route form before it is fetched again."""
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 15.0


def _cache_key(provider: ModelProvider) -> str:
    digest = hashlib.sha256(f"{provider.base_url}|{provider.api_key_encrypted}".encode()).hexdigest()[:16]
    return f"console:provider-models:{provider.pk}:{digest}"


async def _list_ids(provider: ModelProvider, api_key: str) -> list[str]:
    client: Any = sdk_client(api=provider.api, base_url=provider.base_url, api_key=api_key,
                             connect_timeout_seconds=CONNECT_TIMEOUT_SECONDS, read_timeout_seconds=READ_TIMEOUT_SECONDS)
    try:
        ids: list[str] = []
        async for model in client.models.list():
            ids.append(str(model.id))
            if len(ids) >= MAX_MODELS:
                break
        return sorted(set(ids))
    finally:
        await client.close()


def provider_models(*, provider: ModelProvider, use_cache: bool = True) -> dict[str, Any]:
    """Reach ``provider`` and list its model ids.

    Args:
        provider: Any tenant's provider; the caller has checked the user may see it.
        use_cache: Answer a listing made in the last :data:`CACHE_SECONDS` (for the route
            form); False always asks the provider (the "Test" button).

    Returns:
        ``{"ok": True, "models": [id, ...] (sorted, at most 500), "latency_ms": int,
        "cached": bool}`` or ``{"ok": False, "models": [], "error_class": str, "error": str
        (redacted, the key never in it), "latency_ms": int, "cached": False}``. Never raises
        for a provider's failure (refused address, timeout, 401, not JSON …).
    """
    key = _cache_key(provider)
    if use_cache:
        hit = cache.get(key)
        if hit is not None:
            return {**hit, "cached": True}
    tenant = Tenant.objects.get(pk=provider.tenant_id)
    api_key = secret_decrypt(tenant=tenant, ciphertext=provider.api_key_encrypted) if provider.api_key_encrypted else ""
    started = time.monotonic()
    try:
        ids = asyncio.run(_list_ids(provider, api_key))
    except Exception as exc:  # classified and redacted below; the page says what happened
        error = classify_error(exc)
        secrets = [api_key] if api_key else []
        return {"ok": False, "models": [], "error_class": error.error_class,
                "error": redact_secrets(str(error.message or exc), secrets=secrets)[:500],
                "latency_ms": int((time.monotonic() - started) * 1000), "cached": False}
    result = {"ok": True, "models": ids, "latency_ms": int((time.monotonic() - started) * 1000)}
    cache.set(key, result, CACHE_SECONDS)
    return {**result, "cached": False}
