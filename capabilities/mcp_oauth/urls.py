"""``/api/v1/mcp-connections/…`` (included by capabilities/api/urls.py)."""

from django.urls import path

from capabilities.mcp_oauth.api import McpConnectionConnectApi, McpConnectionDetailApi, McpConnectionListApi

urlpatterns = [
    path("mcp-connections/", McpConnectionListApi.as_view(), name="mcp-connection-list"),
    path("mcp-connections/<int:server_id>/", McpConnectionDetailApi.as_view(), name="mcp-connection-detail"),
    path("mcp-connections/<int:server_id>/connect/", McpConnectionConnectApi.as_view(), name="mcp-connection-connect"),
]
