"""``migrate``, run as the database's owner, then row-level security brought up to date.

Django's ``migrate`` with two additions (:mod:`tenants.rls`): its statements run in
:func:`~tenants.rls.owner_mode` (the application role may not create or alter tables), and its
``post_migrate`` signal (:func:`tenants.apps.rls_after_migrate`) creates the role, its grants
and the policy of any tenant-owned table that lacks one.
"""

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import DEFAULT_DB_ALIAS

from tenants.rls import owner_mode


class Command(DjangoMigrate):
    def handle(self, *args, **options):
        with owner_mode(options.get("database") or DEFAULT_DB_ALIAS):
            return super().handle(*args, **options)
