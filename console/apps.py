from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The console's own pages on top of Django admin: the run trace, the dashboard on the
    home page, the agent playground and the setup helpers (templates, static files, views).
    Listed before ``django.contrib.admin`` so its ``admin/`` templates take precedence."""

    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from django.contrib import admin

        admin.site.site_header = "Agent Platform console"
        admin.site.site_title = "Agent Platform console"
        admin.site.index_title = "Dashboard"
