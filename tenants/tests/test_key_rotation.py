"""Master key rotation (``manage.py rotate_encryption_key``, README "Key handling")."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from agent_platform.local_secrets import PUBLISHED_DEV_ENCRYPTION_KEY
from tenants.crypto import SecretDecryptError, secret_decrypt, secret_encrypt
from tenants.models import Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _fresh(tenant: Tenant) -> Tenant:
    return Tenant.objects.get(pk=tenant.pk)


def test_rotation_rewraps_every_data_key_so_the_old_master_key_can_be_dropped(tenant, other_tenant):
    old, new = settings.ENCRYPTION_KEY, Fernet.generate_key().decode()
    secrets = {t.pk: secret_encrypt(tenant=t, plaintext=f"sk-{t.slug}") for t in (tenant, other_tenant)}
    with override_settings(ENCRYPTION_KEY=f"{new},{old}"):
        call_command("rotate_encryption_key", verbosity=0)
    with override_settings(ENCRYPTION_KEY=new):  # the old key is gone
        for t in (tenant, other_tenant):
            assert secret_decrypt(tenant=_fresh(t), ciphertext=secrets[t.pk]) == f"sk-{t.slug}"
    with pytest.raises(SecretDecryptError):  # …and it no longer opens the data keys
        secret_decrypt(tenant=_fresh(tenant), ciphertext=secrets[tenant.pk])


def test_an_install_that_ran_with_the_published_dev_key_moves_to_its_own(tenant, other_tenant):
    """The migration ``scripts/bootstrap.sh`` runs: data keys wrapped by the development key
    this project once published are re-wrapped by the install's own key; the others are left."""
    with override_settings(ENCRYPTION_KEY=PUBLISHED_DEV_ENCRYPTION_KEY):
        Tenant.objects.filter(pk=tenant.pk).update(wrapped_data_key=Fernet(PUBLISHED_DEV_ENCRYPTION_KEY).encrypt(
            Fernet.generate_key()).decode())
        ciphertext = secret_encrypt(tenant=_fresh(tenant), plaintext="sk-provider")
    untouched = _fresh(other_tenant).wrapped_data_key
    with pytest.raises(SecretDecryptError):
        secret_decrypt(tenant=_fresh(tenant), ciphertext=ciphertext)
    with pytest.raises(CommandError, match="could not be unwrapped"):
        call_command("rotate_encryption_key", "--only-unreadable", verbosity=0)
    call_command("rotate_encryption_key", "--from-published-dev-key", "--only-unreadable", verbosity=0)
    assert secret_decrypt(tenant=_fresh(tenant), ciphertext=ciphertext) == "sk-provider"
    assert _fresh(other_tenant).wrapped_data_key == untouched
    with override_settings(ENCRYPTION_KEY=PUBLISHED_DEV_ENCRYPTION_KEY), pytest.raises(SecretDecryptError):
        secret_decrypt(tenant=_fresh(tenant), ciphertext=ciphertext)  # the published key opens nothing now


def test_a_dry_run_writes_nothing(tenant):
    before = _fresh(tenant).wrapped_data_key
    with override_settings(ENCRYPTION_KEY=f"{Fernet.generate_key().decode()},{settings.ENCRYPTION_KEY}"):
        call_command("rotate_encryption_key", "--dry-run", verbosity=0)
    assert _fresh(tenant).wrapped_data_key == before
