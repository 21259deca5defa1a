"""Writes of guardrails (the admin API's; the console writes through the model's ``clean``)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from guardrails.models import Guardrail


@transaction.atomic
def guardrail_save(*, tenant: Any, guardrail: Guardrail | None = None, **fields: Any) -> Guardrail:
    """Create (``guardrail`` None) or change a guardrail of ``tenant`` with ``fields`` (model
    field names; ``agent`` and ``route`` as the tenant's rows), validated by
    :meth:`Guardrail.clean` (its agent records a new version: ``agents.signals``).

    Raises:
        django.core.exceptions.ValidationError: by field (a config the kind cannot use, ``mask``
            where it does not apply, a model check without a route, a name the agent already has).
    """
    row = guardrail if guardrail is not None else Guardrail(tenant=tenant)
    for name, value in fields.items():
        setattr(row, name, value)
    row.full_clean()
    row.save()
    return row
