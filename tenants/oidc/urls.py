"""Single sign-on's URLs, under ``/oidc/`` (404 while ``OIDC_ENABLED`` is off)."""

from django.urls import path

from tenants.oidc.views import OidcCallbackView, OidcLoginView

urlpatterns = [
    path("authenticate/", OidcLoginView.as_view(), name="oidc-login"),
    # The redirect URI registered at the provider: <origin>/oidc/callback/
    path("callback/", OidcCallbackView.as_view(), name="oidc-callback"),
]
