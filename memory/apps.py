from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Memory"

    def ready(self) -> None:
        import memory.kind  # noqa: F401 - registers the ``memory`` capability kind
