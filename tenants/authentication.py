"""DRF authentication: ``Authorization: Bearer ap_…`` API tokens."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from tenants.selectors import api_token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates ``Authorization: Bearer <token>``; ``request.auth`` is the ApiToken row."""

    keyword = "Bearer"

    def authenticate(self, request):  # type: ignore[override]
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Bearer <token>'.")
        try:
            raw = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Invalid token.") from exc
        token = api_token_authenticate(raw=raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return token.membership.user, token

    def authenticate_header(self, request) -> str:  # type: ignore[override]
        return self.keyword
