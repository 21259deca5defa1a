from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"

    def ready(self) -> None:
        from agents import signals  # noqa: F401  (connects the version-recording receivers)
