"""Serializers of the evaluation admin API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agents.models import AgentInstance
from evaluation.dataset_io import item_data_validate
from evaluation.models import Dataset, DatasetItem, Experiment, ExperimentResult
from evaluation.scorers import InvalidExpectation, scorers_validate
from sessions.models import Run
from tenants.api.mixins import TenantPrimaryKeyRelatedField


class DatasetSerializer(serializers.ModelSerializer):
    items = serializers.SerializerMethodField(help_text="Number of items.")

    class Meta:
        model = Dataset
        fields = ["id", "name", "description", "items", "created_at", "updated_at"]

    @extend_schema_field(OpenApiTypes.INT)
    def get_items(self, obj: Dataset) -> int:
        counted = getattr(obj, "item_count", None)
        return counted if counted is not None else obj.items.count()


class DatasetItemSerializer(serializers.ModelSerializer):
    """An item; ``expected``: ``{reference?, facts?: [str | [str]] (a list: alternatives), regex?, json_schema?, tool_calls?:
    [{name, arguments_subset}]}``; ``messages``: ``[{role: user|assistant, content}]`` ending
    with the user's (optional)."""

    input = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    messages = serializers.JSONField(required=False)
    expected = serializers.JSONField(required=False)
    metadata = serializers.JSONField(required=False)

    class Meta:
        model = DatasetItem
        fields = ["id", "dataset", "input", "messages", "expected", "metadata", "source_run", "created_at"]
        read_only_fields = ["dataset", "source_run", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        current = {}
        if self.instance is not None:
            current = {
                "input": self.instance.input,
                "messages": self.instance.messages,
                "expected": self.instance.expected,
                "metadata": self.instance.metadata,
            }
        try:
            return item_data_validate(current | attrs)
        except InvalidExpectation as exc:
            raise serializers.ValidationError({"non_field_errors": [str(exc)]}) from exc


class DatasetImportSerializer(serializers.Serializer):
    """JSON: ``{file_format, content}``; multipart: ``file`` (and ``file_format``, else from the
    file name's ending)."""

    file_format = serializers.ChoiceField(choices=["jsonl", "csv"], required=False)
    content = serializers.CharField(required=False, trim_whitespace=False, max_length=20_000_000)
    file = serializers.FileField(required=False)


class DatasetImportResultSerializer(serializers.Serializer):
    imported = serializers.IntegerField()
    dataset = DatasetSerializer()


class ItemFromRunSerializer(serializers.Serializer):
    run = TenantPrimaryKeyRelatedField(Run, help_text="A completed run of the tenant.")


class ExperimentResultSerializer(serializers.ModelSerializer):
    input = serializers.CharField(source="item.input", read_only=True)
    session = serializers.IntegerField(source="run.session_id", read_only=True, allow_null=True)
    trace_url = serializers.SerializerMethodField(help_text="The run's trace (API), or null.")
    cost_usd = serializers.SerializerMethodField()
    scores = serializers.JSONField(read_only=True, help_text="{scorer: {score, passed, detail} | {skipped}}")

    class Meta:
        model = ExperimentResult
        fields = [
            "id",
            "item",
            "input",
            "repetition",
            "status",
            "run",
            "session",
            "trace_url",
            "output",
            "scores",
            "passed",
            "latency_ms",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "error",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.STR)
    def get_trace_url(self, obj: ExperimentResult) -> str | None:
        return f"/api/v1/runs/{obj.run_id}/trace/" if obj.run_id else None

    @extend_schema_field(OpenApiTypes.DOUBLE)
    def get_cost_usd(self, obj: ExperimentResult) -> float:
        return obj.cost_usd_micros / 1_000_000


class ExperimentSerializer(serializers.ModelSerializer):
    dataset = TenantPrimaryKeyRelatedField(Dataset)
    agent = TenantPrimaryKeyRelatedField(AgentInstance)
    scorers = serializers.JSONField(
        required=False,
        help_text="[{type: exact_match|facts|regex|json_schema|tool_calls|semantic|llm_judge, ...}]; "
        "empty: the default scorers.",
    )
    summary = serializers.JSONField(read_only=True)

    class Meta:
        model = Experiment
        fields = [
            "id",
            "dataset",
            "agent",
            "repetitions",
            "max_concurrency",
            "max_cost_usd",
            "scorers",
            "status",
            "error",
            "summary",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = ["status", "error", "summary", "created_at", "started_at", "finished_at"]

    def validate_scorers(self, value: Any) -> list[dict[str, Any]]:
        try:
            return scorers_validate(value)
        except InvalidExpectation as exc:
            raise serializers.ValidationError(str(exc)) from exc


class ExperimentDetailSerializer(ExperimentSerializer):
    results = ExperimentResultSerializer(many=True, read_only=True)

    class Meta(ExperimentSerializer.Meta):
        fields = [*ExperimentSerializer.Meta.fields, "results"]


class CompareSideSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    agent = serializers.IntegerField()
    status = serializers.CharField()
    summary = serializers.JSONField()


class CompareItemSideSerializer(serializers.Serializer):
    runs = serializers.IntegerField()
    passed = serializers.IntegerField()
    pass_rate = serializers.FloatField()
    mean_score = serializers.FloatField(allow_null=True)
    results = serializers.ListField(child=serializers.IntegerField())


class CompareItemSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    input = serializers.CharField()
    change = serializers.ChoiceField(choices=["regression", "improvement", "missing", "same"])
    delta = serializers.FloatField()
    a = CompareItemSideSerializer(allow_null=True)
    b = CompareItemSideSerializer(allow_null=True)


class CompareSerializer(serializers.Serializer):
    a = CompareSideSerializer()
    b = CompareSideSerializer()
    pass_rate_delta = serializers.FloatField(allow_null=True)
    counts = serializers.DictField(child=serializers.IntegerField())
    items = CompareItemSerializer(many=True)
