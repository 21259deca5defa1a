"""Model providers and model routes (ordered fallback entries)."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


class ModelProvider(TenantOwnedModel):
    """An OpenAI-compatible endpoint and its API key (encrypted with the tenant's data key)."""

    name = models.CharField(max_length=100)
    base_url = models.URLField(max_length=500, help_text="OpenAI-compatible base URL, e.g. https://api.openai.com/v1")
    api_key_encrypted = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="provider_unique_name")]

    def __str__(self) -> str:
        return self.name

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)


class ModelRoute(TenantOwnedModel):
    """An ordered list of entries: the first that answers wins (fallback before the first token)."""

    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="route_unique_name")]

    def __str__(self) -> str:
        return self.name


class ToolCallMode(models.TextChoices):
    NATIVE = "native", "Native (the API's tool_calls)"
    TEXT = "text", "Text (parse tool calls the model writes as text)"


class ModelRouteEntry(TenantOwnedModel):
    """One model in a route, with its limits and timeouts."""

    route = models.ForeignKey(ModelRoute, on_delete=models.CASCADE, related_name="entries")
    position = models.PositiveIntegerField(default=0, help_text="Lower first.")
    provider = models.ForeignKey(ModelProvider, on_delete=models.PROTECT, related_name="entries")
    model = models.CharField(max_length=200, help_text="The provider's model name.")
    max_input_tokens = models.PositiveIntegerField(default=8192, validators=[MinValueValidator(256)])
    max_output_tokens = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(16)])
    connect_timeout_seconds = models.FloatField(default=10.0, validators=[MinValueValidator(0.1)])
    read_timeout_seconds = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest wait for the first chunk and between chunks.",
    )
    tool_calls = models.CharField(max_length=8, choices=ToolCallMode.choices, default=ToolCallMode.NATIVE)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["route", "position", "id"]
        verbose_name_plural = "model route entries"

    def __str__(self) -> str:
        return f"{self.provider.name}:{self.model}"
