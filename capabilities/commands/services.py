"""Writes of tenant commands."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from capabilities.commands.models import Command
from tenants.models import Tenant


@transaction.atomic
def command_save(*, tenant: Tenant, command: Command | None = None, **fields: Any) -> Command:
    """Create (``command`` None) or update a tenant's slash command with ``fields`` (``name``,
    ``description``, ``template``, ``arguments``).

    Requires the tenant's scope.

    Raises:
        ValidationError: by field: a name that is not slug-like or that another command of the
            tenant has, bad ``arguments`` (:func:`capabilities.commands.models.arguments_errors`),
            a template over 50,000 characters.
    """
    command = command or Command(tenant=tenant)
    for name, value in fields.items():
        setattr(command, name, value)
    command.full_clean()
    command.save()
    return command
