"""The platform as the OAuth 2.1 authorization server of its MCP endpoints (issue 36 §2).

Built on django-oauth-toolkit (DOT): its authorization, token, revocation, dynamic client
registration (RFC 7591), Client ID Metadata Document and metadata (RFC 8414, RFC 9728) views,
configured in ``settings.OAUTH2_PROVIDER``. What this package adds:

- :mod:`oauth_server.resources`: the protected resources (``/mcp/agents/``, ``/mcp/knowledge/``),
  their identifiers and metadata URLs, the issuer.
- :mod:`oauth_server.models`: :class:`~oauth_server.models.McpGrant`, one consent: a user let a
  client act in ONE membership on ONE resource; it follows the refresh-token family.
- :mod:`oauth_server.validator`: DOT's validator, binding the code and tokens to that grant.
- :mod:`oauth_server.views`: the consent page (tenant choice), its login, the metadata documents,
  the rate-limited registration.
- :mod:`oauth_server.tokens`: an access token → :class:`tenants.resolution.Caller`, filled into
  :mod:`tenants.resolution`'s bearer port at start-up (the MCP servers' edge asks that).
- :mod:`oauth_server.api`: the user's grants, listed and revoked (``/api/v1/oauth-grants/``).
"""
