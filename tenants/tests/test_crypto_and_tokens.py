import pytest
from django.test import override_settings

from tenants.crypto import SecretDecryptError, secret_decrypt, secret_encrypt
from tenants.selectors import api_token_authenticate
from tenants.services import api_token_create, api_token_revoke

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@pytest.mark.django_db
def test_secrets_round_trip_and_are_tenant_bound(tenant, other_tenant):
    ciphertext = secret_encrypt(tenant=tenant, plaintext="sk-test-secret")
    assert "sk-test-secret" not in ciphertext
    assert secret_decrypt(tenant=tenant, ciphertext=ciphertext) == "sk-test-secret"
    with pytest.raises(SecretDecryptError):
        secret_decrypt(tenant=other_tenant, ciphertext=ciphertext)


@pytest.mark.django_db
def test_a_new_master_key_listed_first_still_decrypts_old_data_keys(tenant):
    from cryptography.fernet import Fernet
    from django.conf import settings

    ciphertext = secret_encrypt(tenant=tenant, plaintext="value")
    with override_settings(ENCRYPTION_KEY=f"{Fernet.generate_key().decode()},{settings.ENCRYPTION_KEY}"):
        assert secret_decrypt(tenant=tenant, ciphertext=ciphertext) == "value"
    with override_settings(ENCRYPTION_KEY=Fernet.generate_key().decode()):
        with pytest.raises(SecretDecryptError):
            secret_decrypt(tenant=tenant, ciphertext=ciphertext)


@pytest.mark.django_db
def test_tokens_are_stored_hashed_and_revocable(world):
    issued = api_token_create(membership=world.member_membership, name="script")
    assert issued.raw.startswith("ap_") and len(issued.raw) > 40
    assert issued.token.token_hash != issued.raw and issued.raw not in issued.token.token_hash
    assert api_token_authenticate(raw=issued.raw).pk == issued.token.pk
    api_token_revoke(token=issued.token)
    assert api_token_authenticate(raw=issued.raw) is None
    assert api_token_authenticate(raw="ap_unknown") is None
