"""``manage.py catalogue_import FILE``: publish the operator's program templates from a YAML file."""

from __future__ import annotations

import yaml
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from capabilities.services import catalogue_import


class Command(BaseCommand):
    help = "Create or update program templates (the operator catalogue) from a YAML file, by slug."

    def add_arguments(self, parser):
        parser.add_argument("path", help="A catalogue file, e.g. deploy/catalogue.yaml")

    def handle(self, *args, **options):
        try:
            with open(options["path"], encoding="utf-8") as handle:
                data = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise CommandError(f"Cannot read {options['path']}: {exc}") from exc
        try:
            templates = catalogue_import(data=data)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        for template in templates:
            self.stdout.write(f"{template.slug}: {template.get_kind_display()}, network {template.network}")
