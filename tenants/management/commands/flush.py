"""``flush``, run as the database's owner (the application role may not ``TRUNCATE``).

Django's ``flush`` in :func:`tenants.rls.owner_mode`; the test runner calls it between
transactional tests.
"""

from django.core.management.commands.flush import Command as DjangoFlush
from django.db import DEFAULT_DB_ALIAS

from tenants.rls import owner_mode


class Command(DjangoFlush):
    def handle(self, **options):
        with owner_mode(options.get("database") or DEFAULT_DB_ALIAS):
            return super().handle(**options)
