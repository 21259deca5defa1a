from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from agent_platform.metrics_view import metrics_endpoint
from automations.hooks import inbound_webhook
from sessions.api.a2a.signing import jwks_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # Prometheus metrics for the operator: 404 unless METRICS_BEARER_TOKEN is set, then a bearer token (docs/observability.md).
    path("metrics", metrics_endpoint, name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script under the CSP.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("agent_platform.api_urls")),
    # Inbound webhook triggers, signed per Standard Webhooks (automations/hooks.py).
    path("hooks/<str:trigger_id>/", inbound_webhook, name="inbound-webhook"),
    # The OpenAI-compatible API: the tenant's agents as models (docs/api.md, "OpenAI-compatible API").
    path("api/openai/v1/", include("sessions.api.openai_compat.urls")),
    # The public key set of the A2A push notifications' signatures (sessions/api/a2a/signing.py).
    path(".well-known/jwks.json", jwks_view, name="jwks"),
    # The OAuth 2.1 authorization server of the MCP endpoints: /.well-known/oauth-*, /oauth/ (oauth_server).
    path("", include("oauth_server.urls")),
    # Our MCP client's OAuth: the authorization callback and the Client ID Metadata Document.
    path("mcp-oauth/", include("capabilities.mcp_oauth.public_urls")),
    # Single sign-on with OpenID Connect: /oidc/authenticate/, /oidc/callback/ and the provider's
    # /oidc/backchannel-logout/ (404 unless OIDC_ENABLED).
    path("oidc/", include("tenants.oidc.urls")),
    path("", include("frontend.urls")),
]
