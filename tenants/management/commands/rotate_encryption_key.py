"""``python manage.py rotate_encryption_key``: re-wrap every tenant's data key with the first
key of ``ENCRYPTION_KEY``.

Rotation of the master key (README, "Key handling"):

1. Put a new key first: ``ENCRYPTION_KEY=<new>,<old>`` (the first encrypts, all decrypt), and
   restart the processes.
2. ``manage.py rotate_encryption_key``: every tenant's data key is wrapped anew by ``<new>``.
   The secrets themselves (provider keys, MCP headers, CLI secrets) are encrypted with the data
   keys, which do not change, so nothing else is rewritten.
3. Drop ``<old>`` from ``ENCRYPTION_KEY`` and restart.

``--also-decrypt-with KEY`` (repeatable) unwraps with a key that is no longer listed.
``--from-published-dev-key`` does so with the development key this project once shipped
(``agent_platform.local_secrets.PUBLISHED_DEV_ENCRYPTION_KEY``): how an install that ran with it moves to its own
key (``scripts/bootstrap.sh`` runs it with ``--only-unreadable``). That key only ever
decrypts here; nothing is encrypted with it.

Exit status 1 (``CommandError``) when a tenant's data key could not be unwrapped by any key;
the others are re-wrapped anyway. Each tenant is updated in a transaction of its own, with its
row locked.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from agent_platform.local_secrets import PUBLISHED_DEV_ENCRYPTION_KEY
from tenants.crypto import SecretDecryptError, data_key_rewrap, data_key_unwrappable
from tenants.models import Tenant
from tenants.scoping import system_scope


class Command(BaseCommand):
    help = "Re-wrap every tenant's data key with the first key of ENCRYPTION_KEY (master key rotation)."

    def add_arguments(self, parser):
        parser.add_argument("--also-decrypt-with", action="append", default=[], metavar="KEY",
                            help="A retired Fernet key that may unwrap data keys (decryption only). Repeatable.")
        parser.add_argument("--from-published-dev-key", action="store_true",
                            help="Also unwrap with the development key this project once published.")
        parser.add_argument("--only-unreadable", action="store_true",
                            help="Re-wrap only the data keys that ENCRYPTION_KEY cannot unwrap now.")
        parser.add_argument("--dry-run", action="store_true", help="Count, write nothing.")

    def handle(self, *args, also_decrypt_with: list[str], from_published_dev_key: bool, only_unreadable: bool,
               dry_run: bool, **options):
        extra = [k.strip() for k in also_decrypt_with if k.strip()]
        if from_published_dev_key:
            extra.append(PUBLISHED_DEV_ENCRYPTION_KEY)
        rewrapped, skipped, failed = 0, 0, []
        with system_scope():  # an operator's command over every tenant (tenants/rls.py)
            for tenant_id in list(Tenant.objects.order_by("pk").values_list("pk", flat=True)):
                with transaction.atomic():
                    tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
                    if only_unreadable and data_key_unwrappable(wrapped=tenant.wrapped_data_key):
                        skipped += 1
                        continue
                    try:
                        new = data_key_rewrap(wrapped=tenant.wrapped_data_key, extra_keys=extra)
                    except SecretDecryptError:
                        failed.append(tenant_id)
                        continue
                    if not dry_run:
                        Tenant.objects.filter(pk=tenant_id).update(wrapped_data_key=new)
                    rewrapped += 1
        verb = "would re-wrap" if dry_run else "re-wrapped"
        self.stdout.write(f"{verb} {rewrapped} tenant data key(s); {skipped} already readable")
        if failed:
            raise CommandError(
                f"{len(failed)} tenant data key(s) could not be unwrapped by any key (tenant ids {failed[:20]}): "
                "add the key that wrapped them with --also-decrypt-with"
            )
