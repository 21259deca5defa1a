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


def _field_values(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.mark.django_db
def test_a_token_comes_with_its_membership_user_and_tenant_as_the_orm_reads_them(world, django_assert_num_queries):
    """One statement, and the token, membership, user and tenant it makes hold what the ORM's
    ``select_related`` read held (every column, through the same converters)."""
    from django.utils import timezone

    from tenants.models import ApiToken

    issued = api_token_create(membership=world.member_membership, name="script")
    ApiToken.all_tenants.filter(pk=issued.token.pk).update(last_used_at=timezone.now())  # no touch: one query
    with django_assert_num_queries(1):
        token = api_token_authenticate(raw=issued.raw)
        membership, user, tenant = token.membership, token.membership.user, token.membership.tenant
    orm = ApiToken.all_tenants.select_related("membership__user", "membership__tenant").get(pk=issued.token.pk)
    assert _field_values(token) == _field_values(orm)
    assert _field_values(membership) == _field_values(orm.membership)
    assert _field_values(user) == _field_values(orm.membership.user)
    assert _field_values(tenant) == _field_values(orm.membership.tenant)
    assert (membership.pk, user.pk, tenant.pk) == (world.member_membership.pk, world.member.pk, world.tenant.pk)
    assert not token._state.adding and token._state.db == "default"


@pytest.mark.django_db
def test_a_token_of_an_inactive_user_does_not_authenticate(world):
    issued = api_token_create(membership=world.member_membership)
    world.member.is_active = False
    world.member.save(update_fields=["is_active"])
    assert api_token_authenticate(raw=issued.raw) is None
