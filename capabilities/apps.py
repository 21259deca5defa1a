from django.apps import AppConfig


class CapabilitiesConfig(AppConfig):
    name = "capabilities"
