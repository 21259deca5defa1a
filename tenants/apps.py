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

        post_migrate.connect(rls_after_migrate, sender=self, dispatch_uid="tenants.rls_after_migrate")
