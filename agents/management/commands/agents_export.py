"""``manage.py agents_export [--tenant SLUG] [--agent SLUG] > agents.yaml`` (agents.as_code)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from agents.as_code import agents_export
from tenants.scoping import system_scope


class Command(BaseCommand):
    help = "Write agents (every tenant's, or one tenant's, or one agent) as YAML to standard output."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", help="Only this tenant's agents (its slug).")
        parser.add_argument("--agent", help="Only the agent with this slug.")

    def handle(self, *args: Any, tenant: str | None = None, agent: str | None = None, **options: Any) -> None:
        with system_scope():  # an operator's command: the slugs decide the tenants
            self.stdout.write(agents_export(tenant_slug=tenant, agent_slug=agent), ending="")
