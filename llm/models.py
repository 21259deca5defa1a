"""Model providers and model routes (ordered fallback entries)."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


class ProviderApi(models.TextChoices):
    OPENAI = "openai", "OpenAI-compatible chat completions"
    ANTHROPIC = "anthropic", "Anthropic Messages"


class ModelProvider(TenantOwnedModel):
    """An endpoint (OpenAI-compatible or Anthropic) and its API key (encrypted with the
    tenant's data key)."""

    name = models.CharField(max_length=100)
    api = models.CharField(max_length=16, choices=ProviderApi.choices, default=ProviderApi.OPENAI)
    base_url = models.URLField(
        max_length=500,
        help_text="OpenAI-compatible: the /v1 base, e.g. https://api.openai.com/v1. Anthropic: https://api.anthropic.com",
    )
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

    def clean(self) -> None:
        """Refuse a ``base_url`` the platform may not connect to on a tenant's behalf:
        loopback, private, link-local, metadata … addresses, unless an operator allowed the
        host (``OUTBOUND_ALLOWED_HOSTS`` / ``OUTBOUND_ALLOWED_CIDRS``; see
        :func:`capabilities.netsafe.check_outbound_url`). Every connect is checked again.

        Raises:
            ValidationError: ``{"base_url": why}``.
        """
        super().clean()
        from llm.netrules import FetchError, check_outbound_url

        if self.base_url:
            try:
                check_outbound_url(self.base_url)
            except FetchError as exc:
                raise ValidationError({"base_url": exc.message}) from exc


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
    provider = models.ForeignKey(ModelProvider, on_delete=models.RESTRICT, related_name="entries")
    model = models.CharField(max_length=200, help_text="The provider's model name.")
    max_input_tokens = models.PositiveIntegerField(default=8192, validators=[MinValueValidator(256)])
    max_output_tokens = models.PositiveIntegerField(default=1024, validators=[MinValueValidator(16)])
    connect_timeout_seconds = models.FloatField(default=10.0, validators=[MinValueValidator(0.1)])
    read_timeout_seconds = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest wait between two chunks (and for the first one, unless set below).",
    )
    first_token_timeout_seconds = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.1)],
        help_text="Longest wait for the first chunk; blank: the read timeout.",
    )
    stream_timeout_seconds = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.1)],
        help_text="Longest a whole answer may stream; blank: no limit.",
    )
    max_retries = models.PositiveIntegerField(
        default=2, validators=[MaxValueValidator(10)],
        help_text="Retries on this entry (rate limit, overload, server error, timeout) before falling back.",
    )
    tool_calls = models.CharField(max_length=8, choices=ToolCallMode.choices, default=ToolCallMode.NATIVE)
    temperature = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)],
        help_text="Sampling temperature (0–2; Anthropic caps at 1); blank: the provider's default.",
    )
    supports_tools = models.BooleanField(default=True, help_text="Whether the model can take tools (native mode).")
    supports_images = models.BooleanField(
        default=False,
        help_text="Whether the model takes image input: images attached in the chat are then sent to it "
                  "(PNG, JPEG, GIF, WebP); otherwise it reads a text reference to each.",
    )
    json_schema_mode = models.BooleanField(
        default=False,
        help_text="Native JSON-schema mode: an agent's output schema (or an API caller's response_format) is sent "
                  "as the request's response_format, and the provider constrains the answer to it (OpenAI, vLLM, "
                  "llama.cpp's llama-server; OpenAI-compatible providers only). Off: the format is asked for in the "
                  "prompt; the answer is checked either way.",
    )
    input_price_per_mtok = models.DecimalField(
        max_digits=12, decimal_places=4, default=Decimal("0"), validators=[MinValueValidator(Decimal("0"))],
        help_text="USD per million prompt tokens.",
    )
    output_price_per_mtok = models.DecimalField(
        max_digits=12, decimal_places=4, default=Decimal("0"), validators=[MinValueValidator(Decimal("0"))],
        help_text="USD per million completion tokens.",
    )

    class Meta(TenantOwnedModel.Meta):
        ordering = ["route", "position", "id"]
        verbose_name_plural = "model route entries"

    def __str__(self) -> str:
        return f"{self.provider.name}:{self.model}"
