"""``manage.py skills_import <tenant-slug> <folder>``: create or update skills from SKILL.md files."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from capabilities.skills.services import skills_import_folder
from tenants.models import Tenant
from tenants.scoping import system_scope, tenant_scope


class Command(BaseCommand):
    help = "Import <folder>/SKILL.md and <folder>/*/SKILL.md as skills of a tenant (create or update by name)."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="The tenant's slug.")
        parser.add_argument("folder", help="A folder of skill folders, each with a SKILL.md.")

    def handle(self, *args, tenant: str, folder: str, **options):
        with system_scope():  # the slug decides the tenant
            tenant_row = Tenant.objects.filter(slug=tenant).first()
        if tenant_row is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        with tenant_scope(tenant_row.pk):
            try:
                results = skills_import_folder(tenant_id=tenant_row.pk, folder=Path(folder))
            except FileNotFoundError as exc:
                raise CommandError(str(exc)) from exc
        if not results:
            raise CommandError(f"No SKILL.md found in {folder} or its subfolders.")
        failed = 0
        for r in results:
            if r.error:
                failed += 1
                self.stderr.write(f"{r.path}: {r.error}")
            else:
                self.stdout.write(f"{'created' if r.created else 'updated'} {r.name} ({r.path})")
        if failed:
            raise CommandError(f"{failed} of {len(results)} SKILL.md file(s) could not be imported.")
