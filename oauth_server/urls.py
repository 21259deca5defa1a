"""The authorization server's routes, mounted at the site root (agent_platform/urls.py).

Under DOT's namespace ``oauth2_provider`` (its metadata view reverses ``authorize``, ``token``,
``revoke-token``, ``dcr-register``): ``/.well-known/oauth-authorization-server`` (RFC 8414),
``/.well-known/oauth-protected-resource/mcp/<name>/`` (RFC 9728; the root one and
``/.well-known/openid-configuration`` are JSON 404s), ``/oauth/authorize/``,
``/oauth/token/``, ``/oauth/revoke_token/``, ``/oauth/register/`` (RFC 7591). The sign-in is
the chat app's (``/?next=…``).
"""

from django.urls import include, path, re_path
from oauth2_provider import views as dot

from oauth_server import views

_patterns = [
    path(".well-known/oauth-authorization-server", dot.OAuthServerMetadataView.as_view(), name="oauth-server-metadata"),
    re_path(
        r"^\.well-known/oauth-protected-resource/?$",
        views.root_protected_resource_metadata,
        name="oauth-resource-metadata-root",
    ),
    path(".well-known/openid-configuration", views.openid_configuration, name="openid-configuration"),
    re_path(
        r"^\.well-known/oauth-protected-resource/(?P<resource_path>.+)$",
        views.ProtectedResourceMetadataView.as_view(),
        name="oauth-resource-metadata-path",
    ),
    path("oauth/authorize/", views.ConsentView.as_view(), name="authorize"),
    path("oauth/token/", views.McpTokenView.as_view(), name="token"),
    path("oauth/revoke_token/", dot.RevokeTokenView.as_view(), name="revoke-token"),
    path("oauth/register/", views.RegistrationView.as_view(), name="dcr-register"),
    path(
        "oauth/register/<str:client_id>/",
        dot.DynamicClientRegistrationManagementView.as_view(),
        name="dcr-register-management",
    ),
]

urlpatterns = [
    path("", include((_patterns, "oauth2_provider"), namespace="oauth2_provider")),
]
