from django.apps import AppConfig


class OAuthServerConfig(AppConfig):
    name = "oauth_server"
    label = "oauth_server"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "OAuth for MCP clients"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete
        from oauth2_provider.models import get_application_model

        from oauth_server.redirects import application_allowed_schemes, application_clean
        from oauth_server.services import mcp_grants_of_application_delete
        from oauth_server.tokens import oauth_caller
        from tenants.resolution import bearer_resolver_set

        bearer_resolver_set(oauth_caller)
        # One redirect-URI rule for registration, metadata documents and redirects
        # (oauth_server/redirects.py): DOT's model is not swapped, its two hooks are wrapped.
        application = get_application_model()
        if not getattr(application.clean, "mcp_redirect_rule", False):
            application.clean = application_clean(application.clean)
        application.get_allowed_schemes = application_allowed_schemes
        pre_delete.connect(
            mcp_grants_of_application_delete,
            sender=get_application_model(),
            dispatch_uid="oauth_server.grants_of_application",
        )
