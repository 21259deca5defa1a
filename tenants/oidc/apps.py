"""The single sign-on app (label ``oidc``): its models (the identity link, the sessions it started), admin, templates, checks."""

from django.apps import AppConfig


class OidcConfig(AppConfig):
    name = "tenants.oidc"
    label = "oidc"
    verbose_name = "Single sign-on"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from tenants.oidc.provider import oidc_config_check, provider_logout_remember
        from tenants.oidc.services import oidc_session_signed_out

        oidc_config_check()  # single sign-on on with a wrong setting: refuse to start, naming it
        # Signing out of the platform signs out of the provider too (RP-Initiated Logout).
        user_logged_out.connect(provider_logout_remember, dispatch_uid="tenants.oidc.provider_logout")
        # A session that signs out here has nothing left for the provider's back-channel logout to end.
        user_logged_out.connect(oidc_session_signed_out, dispatch_uid="tenants.oidc.session_signed_out")
