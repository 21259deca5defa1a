"""Single sign-on's URLs, under ``/oidc/`` (404 while ``OIDC_ENABLED`` is off)."""

from django.urls import path

from tenants.oidc.views import OidcBackchannelLogoutView, OidcCallbackView, OidcLoginView

urlpatterns = [
    path("authenticate/", OidcLoginView.as_view(), name="oidc-login"),
    # The redirect URI registered at the provider: <origin>/oidc/callback/
    path("callback/", OidcCallbackView.as_view(), name="oidc-callback"),
    # The back-channel logout URI registered at the provider: <origin>/oidc/backchannel-logout/
    path("backchannel-logout/", OidcBackchannelLogoutView.as_view(), name="oidc-backchannel-logout"),
]
