"""``/mcp-oauth/…``: the authorization callback and the Client ID Metadata Document (included by
agent_platform/urls.py; the paths are services.CALLBACK_PATH and CLIENT_METADATA_PATH)."""

from django.urls import path

from capabilities.mcp_oauth.api import client_metadata, oauth_callback

urlpatterns = [
    path("callback/", oauth_callback, name="mcp-oauth-callback"),
    path("client-metadata.json", client_metadata, name="mcp-oauth-client-metadata"),
]
