"""``manage.py catalogue_check [SLUG ...]``: start each catalogue program once in the sandbox and
say what is wrong (:mod:`capabilities.catalogue_check`). Run it where the worker runs, as the
worker's user, after ``catalogue_import``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from capabilities.catalogue import ProgramTemplate
from capabilities.catalogue_check import template_check


class Command(BaseCommand):
    help = ("Check that every enabled program template (or those named) is where the sandbox can see it, "
            "and that it starts there (a stdio MCP server must list its tools). Exits 1 when one is not.")

    def add_arguments(self, parser):
        parser.add_argument("slugs", nargs="*", help="Templates to check (default: every enabled one).")
        parser.add_argument("--no-start", action="store_true", help="Only check where the programs are.")
        parser.add_argument("--timeout", type=float, default=30.0, help="Seconds each start may take (default 30).")

    def handle(self, *args, **options):
        templates = ProgramTemplate.objects.order_by("slug")
        if options["slugs"]:
            templates = templates.filter(slug__in=options["slugs"])
            unknown = sorted(set(options["slugs"]) - {t.slug for t in templates})
            if unknown:
                raise CommandError(f"No program template {', '.join(unknown)} (manage.py catalogue_import first).")
        else:
            templates = templates.filter(enabled=True)
        failed = 0
        for template in templates:
            result = template_check(template, start=not options["no_start"], timeout_seconds=options["timeout"])
            if result.ok:
                self.stdout.write(f"ok    {result.slug} ({result.kind}): {result.detail or 'where the sandbox sees it'}")
                continue
            failed += 1
            self.stdout.write(f"FAIL  {result.slug} ({result.kind})")
            for problem in result.problems:
                self.stdout.write(f"      - {problem}")
        if failed:
            raise CommandError(f"{failed} of {templates.count()} template(s) would not run in the sandbox.")
