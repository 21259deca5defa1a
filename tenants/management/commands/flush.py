"""``flush``, run as the database's login user (the application role may not ``TRUNCATE``).

Django's ``flush`` in :func:`tenants.rls.owner_mode`; the test runner calls it between
transactional tests.
"""

from django.core.management.commands.flush import Command as DjangoFlush

from tenants.rls import owner_mode


class Command(DjangoFlush):
    def handle(self, **options):
        with owner_mode():
            return super().handle(**options)
