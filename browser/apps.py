from django.apps import AppConfig


class BrowserConfig(AppConfig):
    name = "browser"
    verbose_name = "Browser"

    def ready(self) -> None:
        import browser.kind  # noqa: F401 - registers the ``browser`` capability kind

