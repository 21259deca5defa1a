from django.apps import AppConfig


class CapabilitiesConfig(AppConfig):
    name = "capabilities"

    def ready(self) -> None:
        # Each module registers its capability kind (capabilities.registry).
        from capabilities.builtin import kind as _builtin  # noqa: F401
        from capabilities.cli import kind as _cli  # noqa: F401
        from capabilities.mcp import kind as _mcp  # noqa: F401
        from capabilities.skills import kind as _skills  # noqa: F401
