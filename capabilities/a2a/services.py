"""Saving a remote A2A agent (its credentials encrypted) and reading its credentials for a call."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from capabilities.a2a.models import A2aAgent
from tenants.crypto import secret_decrypt_json, secret_encrypt_json
from tenants.models import Tenant


@transaction.atomic
def a2a_agent_save(*, tenant: Tenant, agent: A2aAgent | None = None, headers: dict[str, str] | None = None,
                   **fields: Any) -> A2aAgent:
    """Create or update a remote A2A agent; ``headers`` None keeps the stored credentials, ``{}``
    removes them.

    Raises:
        ValidationError: by field (a card URL the outbound rules refuse, a duplicate name).
    """
    agent = agent or A2aAgent(tenant=tenant)
    for name, value in fields.items():
        setattr(agent, name, value)
    if headers is not None:
        agent.headers_encrypted = secret_encrypt_json(tenant=tenant, value=headers)
    agent.full_clean()
    agent.save()
    return agent


def a2a_agent_headers(agent: A2aAgent) -> dict[str, str]:
    """The agent's credentials, decrypted (never log them)."""
    return {str(k): str(v) for k, v in (secret_decrypt_json(tenant=agent.tenant, ciphertext=agent.headers_encrypted)
                                        or {}).items()}


def a2a_agent_card_record(*, tenant_id: int, agent_id: int, card: dict[str, Any] | None, error: str) -> None:
    """Store the card a run fetched (``card_snapshot``) or its error (``last_error``)."""
    from tenants.scoping import tenant_scope

    with tenant_scope(tenant_id):
        updates: dict[str, Any] = {"last_error": error[:2000]}
        if card is not None:
            updates["card_snapshot"] = card
        A2aAgent.objects.filter(pk=agent_id).update(**updates)
