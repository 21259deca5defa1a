"""Single sign-on with OpenID Connect (issue 40): the operator's provider, claim mapping rules
(a claim's value gives a role in a tenant), the login's account and memberships.

Off unless ``OIDC_ENABLED``; then the login pages offer "Sign in with <OIDC_PROVIDER_NAME>".
Built on mozilla-django-oidc (the authorization code flow with state, nonce and PKCE), made
stricter in :mod:`tenants.oidc.backend`. Modules: :mod:`~tenants.oidc.rules` (the rules, pure),
:mod:`~tenants.oidc.provider` (settings, discovery), :mod:`~tenants.oidc.services` (the
login's writes), :mod:`~tenants.oidc.backend`, :mod:`~tenants.oidc.views`, ``urls``.
Operators' guide: docs/operations-security.md, "Single sign-on (OIDC)".
"""
