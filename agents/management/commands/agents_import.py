"""``manage.py agents_import agents.yaml [--dry-run] [--tenant SLUG]`` (agents.as_code)."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from agents.as_code import ImportError_, agents_import, plans_text
from tenants.scoping import system_scope


class Command(BaseCommand):
    help = "Import agents from YAML (agents_export's shape): --dry-run prints what would change; else it applies."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", help="The YAML file ('-': standard input).")
        parser.add_argument("--dry-run", action="store_true", help="Print the changes; write nothing.")
        parser.add_argument("--tenant", help="Only this tenant's agents of the file.")

    def handle(self, *args: Any, path: str, dry_run: bool = False, tenant: str | None = None, **options: Any) -> None:
        try:
            text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()  # noqa: SIM115
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc}") from exc
        try:
            with system_scope():
                plans = agents_import(text, dry_run=dry_run, tenant_slug=tenant)
        except ImportError_ as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(plans_text(plans), ending="")
        self.stdout.write("Dry run: nothing written.\n" if dry_run else f"Imported {len(plans)} agent(s).\n")
