"""The single sign-on app (label ``oidc``): its model (the identity link), admin, templates, checks."""

from django.apps import AppConfig


class OidcConfig(AppConfig):
    name = "tenants.oidc"
    label = "oidc"
    verbose_name = "Single sign-on"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants.oidc.provider import oidc_config_check

        oidc_config_check()  # single sign-on on with a wrong setting: refuse to start, naming it
