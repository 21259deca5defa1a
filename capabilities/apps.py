from django.apps import AppConfig


class CapabilitiesConfig(AppConfig):
    name = "capabilities"

    def ready(self) -> None:
        # Each module registers its capability kind (capabilities.registry).
        import capabilities.a2a.kind  # noqa: F401
        import capabilities.builtin.kind  # noqa: F401
        import capabilities.cli.kind  # noqa: F401
        import capabilities.commands.kind  # noqa: F401
        import capabilities.mcp.kind  # noqa: F401
        import capabilities.skills.kind  # noqa: F401
        import capabilities.subagents.kind  # noqa: F401
