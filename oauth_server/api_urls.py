from django.urls import path

from oauth_server import api

urlpatterns = [
    path("oauth-grants/", api.OAuthGrantListApi.as_view(), name="oauth-grant-list"),
    path("oauth-grants/<int:grant_id>/", api.OAuthGrantRevokeApi.as_view(), name="oauth-grant-detail"),
]
