from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def rls_after_migrate(using: str = "default", **kwargs: Any) -> None:
    """``post_migrate``: the role, grants and row-level security policies (:func:`tenants.rls.apply`)."""
    from django.db import connections

    from tenants import rls

    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with rls.owner_mode():
        rls.apply(connection)


class TenantsConfig(AppConfig):
    name = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants import schema  # noqa: F401  (registers the OpenAPI auth extension)
        from tenants.audit import connect_signals

        connect_signals()
        # A sign-out closes the streams on that session's cookie at once (not at their next check).
        from django.contrib.auth.signals import user_logged_out

        from agent_platform.revocations import session_signed_out

        user_logged_out.connect(session_signed_out, dispatch_uid="agent_platform.revocations.session_signed_out")

        post_migrate.connect(rls_after_migrate, sender=self, dispatch_uid="tenants.rls_after_migrate")
