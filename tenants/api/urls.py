from django.urls import path

from tenants.api import views

urlpatterns = [
    path("auth/login/", views.AuthLoginApi.as_view(), name="auth-login"),
    path("auth/logout/", views.AuthLogoutApi.as_view(), name="auth-logout"),
    path("auth/me/", views.AuthMeApi.as_view(), name="auth-me"),
    path("tokens/", views.ApiTokenListCreateApi.as_view(), name="token-list"),
    path("tokens/<int:token_id>/revoke/", views.ApiTokenRevokeApi.as_view(), name="token-revoke"),
]
