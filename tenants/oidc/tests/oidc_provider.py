"""A small OpenID Connect provider for tests, on 127.0.0.1 (a thread of the test process).

It serves what a relying party uses in the authorization code flow: the discovery document,
the authorization endpoint (no login page: it signs in :attr:`FakeOidcProvider.user`, the
claims the test set), the token endpoint (checks the client's id and secret, the one-time code,
the redirect URI and the PKCE verifier, S256), the JWKS (one RSA key) and UserInfo (bearer
access token). ID tokens are RS256 JWTs signed with PyJWT.

Each authorization is a session of the provider: its ID token carries a fresh ``sid``
(:attr:`FakeOidcProvider.sids`, in order), and :meth:`FakeOidcProvider.logout_token` makes the
Back-Channel Logout token that would end it (or all of a ``sub``'s).

Attacks are set on the instance before a login: :attr:`id_token_changes` (claims replaced or,
with value ``None``, removed), :attr:`sign_with_other_key` (a key not in the JWKS),
:attr:`unsigned` (``alg: none``), :attr:`userinfo_changes`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class FakeOidcProvider:
    """The provider; :meth:`start` serves it, :meth:`stop` ends it (see the module's docstring)."""

    def __init__(self, *, client_id: str = "agent-platform", client_secret: str = "s3cret-client",
                 userinfo: bool = True, end_session: bool = True) -> None:
        self.client_id = client_id
        self.end_session_enabled = end_session
        self.logout_requests: list[dict[str, str]] = []
        """The RP-initiated logouts received (``GET /logout``'s query)."""
        self.client_secret = client_secret
        self.userinfo_enabled = userinfo
        self.key = _key()
        self.kid = "test-key-1"
        self.user: dict[str, Any] = {"sub": "user-1"}
        """The claims of whoever the next authorization signs in."""
        self.deny = False
        """Answer the next authorization with ``error=access_denied``."""
        self.id_token_changes: dict[str, Any] = {}
        self.userinfo_changes: dict[str, Any] = {}
        self.sign_with_other_key = False
        self.unsigned = False
        self.authorization_requests: list[dict[str, str]] = []
        self.token_requests: list[dict[str, str]] = []
        self.sids: list[str] = []
        """The ``sid`` of each authorization's ID token, in order."""
        self._codes: dict[str, dict[str, Any]] = {}
        self._access_tokens: dict[str, dict[str, Any]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def issuer(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeOidcProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_GET(self) -> None:  # noqa: N802
                provider.handle(self, "GET", b"")

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                provider.handle(self, "POST", body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-oidc", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the endpoints ------------------------------------------------------------------------

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            **({"userinfo_endpoint": f"{self.issuer}/userinfo"} if self.userinfo_enabled else {}),
            **({"end_session_endpoint": f"{self.issuer}/logout"} if self.end_session_enabled else {}),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "backchannel_logout_supported": True,
            "backchannel_logout_session_supported": True,
        }

    def handle(self, request: BaseHTTPRequestHandler, method: str, body: bytes) -> None:
        url = urlsplit(request.path)
        routes = {
            ("GET", "/.well-known/openid-configuration"): lambda: (200, self.discovery()),
            ("GET", "/jwks"): lambda: (200, self.jwks()),
            ("GET", "/authorize"): lambda: self.authorize(parse_qs(url.query)),
            ("POST", "/token"): lambda: self.token(parse_qs(body.decode())),
            ("GET", "/userinfo"): lambda: self.userinfo(request.headers.get("Authorization", "")),
            ("GET", "/logout"): lambda: self.logout(parse_qs(url.query)),
        }
        route = routes.get((method, url.path))
        status, answer = route() if route else (404, {"error": "not_found"})
        if status == 302:
            request.send_response(302)
            request.send_header("Location", answer)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        data = json.dumps(answer).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def logout(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        """RP-Initiated Logout: recorded; back to ``post_logout_redirect_uri``."""
        params = {name: values[0] for name, values in query.items()}
        self.logout_requests.append(params)
        return 302, params.get("post_logout_redirect_uri") or "/"

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def authorize(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        params = {name: values[0] for name, values in query.items()}
        self.authorization_requests.append(params)
        if params.get("client_id") != self.client_id or params.get("response_type") != "code":
            return 400, {"error": "invalid_request"}
        back = params["redirect_uri"]
        if self.deny:
            return 302, f"{back}?{urlencode({'error': 'access_denied', 'state': params.get('state', '')})}"
        code = secrets.token_urlsafe(16)
        sid = secrets.token_hex(8)
        self.sids.append(sid)
        self._codes[code] = {"claims": {"sid": sid, **self.user}, "nonce": params.get("nonce"), "redirect_uri": back,
                             "challenge": params.get("code_challenge"), "method": params.get("code_challenge_method")}
        return 302, f"{back}?{urlencode({'code': code, 'state': params.get('state', '')})}"

    def token(self, form: dict[str, list[str]]) -> tuple[int, Any]:
        params = {name: values[0] for name, values in form.items()}
        self.token_requests.append(params)
        grant = self._codes.pop(params.get("code", ""), None)  # one use only
        if (params.get("client_id") != self.client_id or params.get("client_secret") != self.client_secret):
            return 401, {"error": "invalid_client"}
        if grant is None or params.get("grant_type") != "authorization_code":
            return 400, {"error": "invalid_grant"}
        if params.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri"}
        verifier = params.get("code_verifier", "")
        digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if grant["method"] != "S256" or digest != grant["challenge"]:
            return 400, {"error": "invalid_grant", "error_description": "PKCE"}
        access_token = secrets.token_urlsafe(16)
        self._access_tokens[access_token] = grant["claims"]
        return 200, {"access_token": access_token, "token_type": "Bearer", "expires_in": 300,
                     "id_token": self.id_token(grant["claims"], grant["nonce"])}

    def id_token(self, user: dict[str, Any], nonce: str | None) -> str:
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": self.client_id, "iat": now, "exp": now + 300, **user}
        if nonce is not None:
            claims["nonce"] = nonce
        for name, value in self.id_token_changes.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        if self.unsigned:
            return jwt.encode(claims, None, algorithm="none", headers={"kid": self.kid})
        key = _key() if self.sign_with_other_key else self.key
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": self.kid})

    def logout_token(self, *, sub: str | None = None, sid: str | None = None, changes: dict[str, Any] | None = None,
                     headers: dict[str, Any] | None = None, key: Any = None, algorithm: str = "RS256") -> str:
        """A Back-Channel Logout token (Back-Channel Logout 1.0, §2.4) for ``sub`` and/or ``sid``,
        signed with the JWKS's key unless ``key`` is given; ``changes`` replace claims (``None``
        removes one), ``headers`` are added to the JOSE header (``typ: logout+jwt`` by default)."""
        now = int(time.time())
        claims: dict[str, Any] = {"iss": self.issuer, "aud": self.client_id, "iat": now, "exp": now + 120,
                                  "jti": secrets.token_hex(12),
                                  "events": {"http://schemas.openid.net/event/backchannel-logout": {}}}
        if sub is not None:
            claims["sub"] = sub
        if sid is not None:
            claims["sid"] = sid
        for name, value in (changes or {}).items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        return jwt.encode(claims, self.key if key is None else key, algorithm=algorithm,
                          headers={"kid": self.kid, "typ": "logout+jwt", **(headers or {})})

    def userinfo(self, authorization: str) -> tuple[int, Any]:
        claims = self._access_tokens.get(authorization.removeprefix("Bearer ").strip())
        if claims is None:
            return 401, {"error": "invalid_token"}
        return 200, {**claims, **self.userinfo_changes}
