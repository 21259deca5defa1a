"""The single sign-on app (label ``oidc``): its model (the identity link), admin, templates, checks."""

from django.apps import AppConfig


class OidcConfig(AppConfig):
    name = "tenants.oidc"
    label = "oidc"
    verbose_name = "Single sign-on"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from tenants.oidc.provider import oidc_config_check, provider_logout_remember

        oidc_config_check()  # single sign-on on with a wrong setting: refuse to start, naming it
        # Signing out of the platform signs out of the provider too (RP-Initiated Logout).
        user_logged_out.connect(provider_logout_remember, dispatch_uid="tenants.oidc.provider_logout")
