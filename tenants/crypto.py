"""Per-tenant secret encryption (envelope encryption).

Each tenant has its own random data key (a Fernet key). The data key is stored only wrapped
(encrypted) by the master key from ``settings.ENCRYPTION_KEY``; secrets (provider API keys,
MCP headers and env vars) are encrypted with the tenant's data key. Rotating the master key
means re-wrapping the data keys only. ``ENCRYPTION_KEY`` may list several comma-separated
keys: the first encrypts, all decrypt (``cryptography``'s MultiFernet).

Fernet is AES-128-CBC + HMAC-SHA256 with a timestamp (the cryptography project's spec:
https://github.com/fernet/spec). Plaintexts are never logged.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from rest_framework import status

from agent_platform.api_errors import ApplicationError

if TYPE_CHECKING:
    from tenants.models import Tenant

logger = logging.getLogger(__name__)


class SecretDecryptError(Exception):
    """A ciphertext could not be decrypted (wrong key, or tampered)."""


class DataKeyUnavailable(SecretDecryptError, ApplicationError):
    """The tenant's data key does not open with ``ENCRYPTION_KEY``: the platform runs with other
    keys than the ones its database was made with (a lost or replaced secrets file). None of
    the tenant's secrets can be read or written until the right key is configured.

    An API request that meets it answers 503 with :data:`MESSAGE` (``extra.reason``
    ``"tenant_secrets_unavailable"``), not a bare 500; code that handles
    :class:`SecretDecryptError` handles it too.
    """

    MESSAGE = ("This tenant's stored secrets cannot be opened with the platform's configured ENCRYPTION_KEY "
               "(the platform runs with other keys than the ones its database was made with). The operator must "
               "restore the secrets file that was used with this database; scripts/bootstrap.sh names it "
               "(docs/operations-security.md, \"Key handling\").")

    def __init__(self, tenant_id: int | None) -> None:
        ApplicationError.__init__(self, self.MESSAGE, extra={"reason": "tenant_secrets_unavailable"},
                                  status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
        self.tenant_id = tenant_id


def _master_fernets() -> list[Fernet]:
    keys = [k.strip() for k in settings.ENCRYPTION_KEY.split(",") if k.strip()]
    fernets = []
    for key in keys:
        raw = key.encode()
        # Accept 32 raw bytes in urlsafe base64 (a Fernet key) only.
        if len(base64.urlsafe_b64decode(raw)) != 32:
            raise ValueError("ENCRYPTION_KEY must be urlsafe base64 of 32 bytes (a Fernet key)")
        fernets.append(Fernet(raw))
    return fernets


def _master() -> MultiFernet:
    return MultiFernet(_master_fernets())


def data_key_rewrap(*, wrapped: str, extra_keys: Sequence[str] = ()) -> str:
    """``wrapped`` (a tenant's wrapped data key) wrapped anew by the first key of
    ``ENCRYPTION_KEY``: the rotation step (``manage.py rotate_encryption_key``).

    Args:
        wrapped: the stored text (``Tenant.wrapped_data_key``).
        extra_keys: Fernet keys that may also unwrap it (decryption only; e.g. a retired
            master key no longer listed in ``ENCRYPTION_KEY``).

    Returns:
        The new wrapped text (the data key itself is unchanged, so every secret stays readable).

    Raises:
        SecretDecryptError: no key of ``ENCRYPTION_KEY`` or ``extra_keys`` unwraps it.
    """
    fernets = [*_master_fernets(), *(Fernet(k.encode()) for k in extra_keys)]
    try:
        return MultiFernet(fernets).rotate(wrapped.encode()).decode()
    except InvalidToken as exc:
        raise SecretDecryptError("no configured key unwraps this data key") from exc


def data_key_unwrappable(*, wrapped: str) -> bool:
    """True when a key of ``ENCRYPTION_KEY`` unwraps ``wrapped`` (a tenant's wrapped data key)."""
    try:
        _master().decrypt(wrapped.encode())
    except InvalidToken:
        return False
    return True


def data_key_new_wrapped() -> str:
    """A fresh data key, wrapped by the master key (text to store on the Tenant row)."""
    return _master().encrypt(Fernet.generate_key()).decode()


def _tenant_fernet(tenant: Tenant) -> Fernet:
    """The tenant's data key. Raises :class:`DataKeyUnavailable` when no key of
    ``ENCRYPTION_KEY`` unwraps it."""
    try:
        data_key = _master().decrypt(tenant.wrapped_data_key.encode())
    except InvalidToken as exc:
        logger.error("the data key of tenant %s does not open with the configured ENCRYPTION_KEY: restore the "
                     "secrets file that was used with this database (scripts/ensure_database.py --check-keys "
                     "names the candidates)", tenant.pk)
        raise DataKeyUnavailable(tenant.pk) from exc
    return Fernet(data_key)


def secret_encrypt(*, tenant: Tenant, plaintext: str) -> str:
    """Encrypt ``plaintext`` with the tenant's data key. Returns "" for "" (no secret).

    Raises:
        DataKeyUnavailable: ``ENCRYPTION_KEY`` does not open the tenant's data key.
    """
    if plaintext == "":
        return ""
    return _tenant_fernet(tenant).encrypt(plaintext.encode()).decode()


def secret_decrypt(*, tenant: Tenant, ciphertext: str) -> str:
    """Decrypt what :func:`secret_encrypt` returned.

    Raises:
        DataKeyUnavailable: ``ENCRYPTION_KEY`` does not open the tenant's data key.
        SecretDecryptError: the ciphertext does not decrypt with it (tampered, or another tenant's).
    """
    if ciphertext == "":
        return ""
    try:
        return _tenant_fernet(tenant).decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise SecretDecryptError(f"cannot decrypt a secret of tenant {tenant.pk}") from exc


def secret_encrypt_json(*, tenant: Tenant, value: dict[str, Any]) -> str:
    """Encrypt a JSON object (e.g. MCP headers or env vars). ``{}`` encrypts to ""."""
    return secret_encrypt(tenant=tenant, plaintext=json.dumps(value) if value else "")


def secret_decrypt_json(*, tenant: Tenant, ciphertext: str) -> dict[str, Any]:
    text = secret_decrypt(tenant=tenant, ciphertext=ciphertext)
    return json.loads(text) if text else {}
