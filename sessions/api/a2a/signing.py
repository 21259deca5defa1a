"""Signed A2A push notifications: a JWT (JWS, ES256) over each notification, checkable with the
platform's public key published as a JWKS at ``/.well-known/jwks.json``.

A2A 1.0 leaves the sender's signature to the implementation and describes this flow ("Push
notifications", security considerations: "Example asymmetric key flow (JWT + JWKS)"): the server
signs a JWT with its private key, the JWT's header names the key (``kid``), its claims are
``iss``, ``aud``, ``iat``, ``exp``, ``jti`` and ``taskId``, the public keys are served as a JWKS;
the receiver fetches the key by ``kid``, checks the signature and the claims. We add
``request_body_sha256`` (the hex SHA-256 of the exact body bytes, as the A2A samples'
notification authentication does) so the signature covers the body: a changed body no longer
matches the claim.

The key is an EC P-256 key derived from ``SECRET_KEY`` (HKDF-SHA256, :data:`KEY_INFO`): every
process signs with the same key and nothing is stored; changing ``SECRET_KEY`` changes the key
(and its ``kid``, the RFC 7638 thumbprint), so receivers that cache the JWKS should fetch it
again for an unknown ``kid``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from functools import lru_cache
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.http import HttpRequest, JsonResponse

JWKS_PATH: Final[str] = "/.well-known/jwks.json"
"""Where the public key set is served (on the platform's origin, without authentication)."""
ALGORITHM: Final[str] = "ES256"
"""The JWS algorithm (ECDSA P-256 with SHA-256, RFC 7518)."""
KEY_INFO: Final[bytes] = b"agent-platform a2a push-notification signing key v1"
"""The HKDF ``info`` that derives the signing key from ``SECRET_KEY``."""
LIFETIME_SECONDS: Final[int] = 300
"""``exp`` − ``iat`` of a notification's JWT: a receiver should refuse an older one (replay)."""
SIGNATURE_HEADER: Final[str] = "x-a2a-notification-signature"
"""The request header that carries the JWT on every notification (``Authorization`` may hold the
config's own credentials)."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@lru_cache(maxsize=4)
def _key(secret: str) -> ec.EllipticCurvePrivateKey:
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=KEY_INFO).derive(secret.encode())
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's group order
    return ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1, ec.SECP256R1())


def signing_key() -> ec.EllipticCurvePrivateKey:
    """The platform's push-notification signing key (P-256), derived from ``SECRET_KEY``."""
    from django.conf import settings

    return _key(settings.SECRET_KEY)


def public_jwk() -> dict[str, str]:
    """The signing key's public half as a JWK (RFC 7517): ``{kty: EC, crv: P-256, x, y, kid,
    use: sig, alg: ES256}``; ``kid`` is its RFC 7638 thumbprint (SHA-256, base64url)."""
    numbers = signing_key().public_key().public_numbers()
    members = {
        "crv": "P-256",
        "kty": "EC",
        "x": _b64url(numbers.x.to_bytes(32, "big")),
        "y": _b64url(numbers.y.to_bytes(32, "big")),
    }
    thumbprint = hashlib.sha256(json.dumps(members, separators=(",", ":"), sort_keys=True).encode()).digest()
    return {**members, "kid": _b64url(thumbprint), "use": "sig", "alg": ALGORITHM}


def jwks() -> dict[str, list[dict[str, str]]]:
    """The JWKS document: ``{"keys": [public_jwk()]}``."""
    return {"keys": [public_jwk()]}


def push_signature(body: bytes, *, issuer: str, audience: str, task_id: str, now: float | None = None) -> str:
    """The JWT that signs one push notification.

    Args:
        body: The exact bytes POSTed (their SHA-256 is the ``request_body_sha256`` claim).
        issuer: ``iss``: the platform's origin the task's client reached (``scheme://host``).
        audience: ``aud``: the receiver's URL (the config's ``url``).
        task_id: ``taskId``: the task (run) id.
        now: Unix seconds for ``iat`` (default: the clock).

    Returns:
        A compact JWS (``header.claims.signature``), header ``{alg: ES256, kid, typ: JWT}``, claims
        ``iss, aud, iat, exp (iat + LIFETIME_SECONDS), jti (new per call), taskId,
        request_body_sha256``.
    """
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "iat": issued,
        "exp": issued + LIFETIME_SECONDS,
        "jti": uuid.uuid4().hex,
        "taskId": task_id,
        "request_body_sha256": hashlib.sha256(body).hexdigest(),
    }
    return jwt.encode(claims, signing_key(), algorithm=ALGORITHM, headers={"kid": public_jwk()["kid"], "typ": "JWT"})


def jwks_view(request: HttpRequest) -> JsonResponse:
    """``GET /.well-known/jwks.json``: the public key set (no authentication; cacheable an hour)."""
    response = JsonResponse(jwks())
    response["Cache-Control"] = "public, max-age=3600"
    return response
