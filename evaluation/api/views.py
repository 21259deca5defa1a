"""The evaluation admin API (tenant owners and admins): datasets and their items (import,
export, add from a run), experiments (start, status and results, cancel) and the comparison
of two experiments. docs/api.md and docs/admin-guide.md, "Evaluation"."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.decorators import action
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from agent_platform.api_parsers import BoundedJSONParser
from agent_platform.api_schema import paginated
from evaluation.api.serializers import (
    CompareSerializer,
    DatasetImportResultSerializer,
    DatasetImportSerializer,
    DatasetItemSerializer,
    DatasetSerializer,
    ExperimentDetailSerializer,
    ExperimentSerializer,
    ItemFromRunSerializer,
)
from evaluation.dataset_io import DatasetImportError, items_export_csv, items_export_jsonl, items_parse
from evaluation.models import Dataset, DatasetItem, Experiment
from evaluation.selectors import experiment_get, experiments_compare
from evaluation.services import (
    dataset_item_from_run,
    dataset_items_add,
    dataset_save,
    experiment_cancel,
    experiment_create,
)
from tenants.api.mixins import IsTenantAdmin, TenantScopedApiView, TenantScopedViewSet
from tenants.audit import Action, audit_record

MAX_IMPORT_BYTES = 20_000_000


class DatasetViewSet(TenantScopedViewSet):
    """Datasets: CRUD, ``import/`` (JSON Lines or CSV) and ``export/``."""

    model = Dataset
    serializer_class = DatasetSerializer
    parser_classes = [BoundedJSONParser, MultiPartParser]

    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().annotate(item_count=models.Count("items")).order_by("name", "id")

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = dataset_save(tenant=self.request.tenant, **serializer.validated_data)

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = dataset_save(
            tenant=self.request.tenant, dataset=serializer.instance, **serializer.validated_data
        )

    @extend_schema(
        request={"application/json": DatasetImportSerializer, "multipart/form-data": DatasetImportSerializer},
        responses={201: DatasetImportResultSerializer},
        description="Add the items of a JSON Lines or CSV file to the dataset (all or none). A bad line answers "
        "400 with extra.line (1-based).",
    )
    @action(detail=True, methods=["post"], url_path="import")
    def import_items(self, request: Request, pk: str | None = None) -> Response:
        dataset = self.get_object()
        data = DatasetImportSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        text, file_format = _import_text(data.validated_data)
        try:
            items = items_parse(text, file_format)
        except DatasetImportError as exc:
            raise ApplicationError(str(exc), extra={"line": exc.line}) from exc
        with transaction.atomic():
            dataset_items_add(dataset=dataset, items=items)
            audit_record(action=Action.UPDATE, obj=dataset, detail={"imported": len(items), "format": file_format})
        dataset = self.get_queryset().get(pk=dataset.pk)
        return Response(
            {"imported": len(items), "dataset": DatasetSerializer(dataset).data}, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("file_format", str, enum=["jsonl", "csv"], required=False, description="Default jsonl.")
        ],
        responses={(200, "application/x-ndjson"): OpenApiTypes.STR, (200, "text/csv"): OpenApiTypes.STR},
    )
    @action(detail=True, methods=["get"], url_path="export")
    def export_items(self, request: Request, pk: str | None = None) -> HttpResponse:
        dataset = self.get_object()
        file_format = request.query_params.get("file_format", "jsonl")
        if file_format not in ("jsonl", "csv"):
            raise ApplicationError(
                "file_format must be jsonl or csv.", extra={"fields": {"file_format": ["jsonl|csv"]}}
            )
        items = DatasetItem.objects.filter(dataset=dataset).order_by("pk")
        body = items_export_csv(items) if file_format == "csv" else items_export_jsonl(items)
        content_type = "text/csv" if file_format == "csv" else "application/x-ndjson"
        response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="dataset-{dataset.pk}.{file_format}"'
        return response


def _import_text(fields: dict[str, Any]) -> tuple[str, str]:
    """The file's text and format from an import request (a ``file`` or ``content``)."""
    upload, content = fields.get("file"), fields.get("content")
    if (upload is None) == (content is None):
        raise ApplicationError(
            "Send exactly one of `file` (multipart) or `content`.",
            extra={"fields": {"file": ["Exactly one of file, content."]}},
        )
    file_format = fields.get("file_format")
    if upload is not None:
        if upload.size > MAX_IMPORT_BYTES:
            raise ApplicationError("The file is too large.", status_code=413, extra={"max_bytes": MAX_IMPORT_BYTES})
        name = (upload.name or "").lower()
        file_format = file_format or ("csv" if name.endswith(".csv") else "jsonl")
        try:
            content = upload.read().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ApplicationError("The file is not UTF-8 text.", extra={"line": 0}) from exc
    return content, file_format or "jsonl"


def _dataset_or_404(dataset_id: int) -> Dataset:
    dataset = Dataset.objects.filter(pk=dataset_id).first()
    if dataset is None:
        raise NotFound("Dataset not found.")
    return dataset


class _AdminApi(TenantScopedApiView):
    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]


class DatasetItemListApi(_AdminApi):
    """``GET``: a dataset's items, paginated. ``POST``: add one item."""

    @extend_schema(
        operation_id="v1_admin_datasets_items_list",
        responses=paginated("PaginatedDatasetItemList", DatasetItemSerializer()),
    )
    def get(self, request: Request, dataset_id: int) -> Response:
        dataset = _dataset_or_404(dataset_id)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(
            DatasetItem.objects.filter(dataset=dataset).order_by("pk"), request, view=self
        )
        return paginator.get_paginated_response(DatasetItemSerializer(page, many=True).data)

    @extend_schema(request=DatasetItemSerializer, responses={201: DatasetItemSerializer})
    def post(self, request: Request, dataset_id: int) -> Response:
        dataset = _dataset_or_404(dataset_id)
        data = DatasetItemSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            [item] = dataset_items_add(dataset=dataset, items=[data.validated_data])
            audit_record(action=Action.CREATE, obj=item)
        return Response(DatasetItemSerializer(item).data, status=status.HTTP_201_CREATED)


class DatasetItemDetailApi(_AdminApi):
    """One item: read, change (``PATCH``), delete."""

    def _item(self, dataset_id: int, item_id: int) -> DatasetItem:
        item = DatasetItem.objects.filter(pk=item_id, dataset_id=dataset_id).first()
        if item is None:
            raise NotFound("Item not found.")
        return item

    @extend_schema(responses=DatasetItemSerializer)
    def get(self, request: Request, dataset_id: int, item_id: int) -> Response:
        return Response(DatasetItemSerializer(self._item(dataset_id, item_id)).data)

    @extend_schema(request=DatasetItemSerializer, responses=DatasetItemSerializer)
    def patch(self, request: Request, dataset_id: int, item_id: int) -> Response:
        item = self._item(dataset_id, item_id)
        data = DatasetItemSerializer(item, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            for name, value in data.validated_data.items():
                setattr(item, name, value)
            item.save()
            audit_record(action=Action.UPDATE, obj=item)
        return Response(DatasetItemSerializer(item).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, dataset_id: int, item_id: int) -> Response:
        item = self._item(dataset_id, item_id)
        with transaction.atomic():
            audit_record(action=Action.DELETE, obj=item)
            item.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class DatasetItemFromRunApi(_AdminApi):
    """``POST {run}``: add a completed run of the tenant to the dataset (input: the user's
    message, expected.reference: the reply)."""

    @extend_schema(request=ItemFromRunSerializer, responses={201: DatasetItemSerializer})
    def post(self, request: Request, dataset_id: int) -> Response:
        dataset = _dataset_or_404(dataset_id)
        data = ItemFromRunSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            item = dataset_item_from_run(dataset=dataset, run=data.validated_data["run"])
            audit_record(action=Action.CREATE, obj=item, detail={"from_run": item.source_run_id})
        return Response(DatasetItemSerializer(item).data, status=status.HTTP_201_CREATED)


class ExperimentViewSet(TenantScopedViewSet):
    """Experiments: start one (``POST``), list, read with its results, delete, ``cancel/``, and
    ``compare/?a=&b=``."""

    model = Experiment
    serializer_class = ExperimentSerializer
    http_method_names = ["get", "post", "delete", "head", "options"]

    def get_queryset(self) -> models.QuerySet:
        queryset = super().get_queryset()
        if self.action == "retrieve":
            queryset = queryset.prefetch_related("results__item", "results__run")
        return queryset

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return ExperimentDetailSerializer if self.action == "retrieve" else ExperimentSerializer

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        fields = serializer.validated_data
        serializer.instance = experiment_create(
            dataset=fields["dataset"],
            agent=fields["agent"],
            user=self.request.user,
            repetitions=fields.get("repetitions", 1),
            max_concurrency=fields.get("max_concurrency", 4),
            max_cost_usd=fields.get("max_cost_usd"),
            scorers=fields.get("scorers"),
        )

    @extend_schema(request=None, responses={200: ExperimentSerializer})
    @action(detail=True, methods=["post"], url_path="cancel")
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        experiment = self.get_object()
        with transaction.atomic():
            experiment = experiment_cancel(experiment=experiment)
            audit_record(action=Action.UPDATE, obj=experiment, detail={"canceled": True})
        return Response(ExperimentSerializer(experiment).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("a", int, required=True, description="The baseline experiment."),
            OpenApiParameter("b", int, required=True, description="The experiment compared with it."),
        ],
        responses={200: CompareSerializer, 404: OpenApiResponse(description="Either experiment not found.")},
    )
    @action(detail=False, methods=["get"], url_path="compare")
    def compare(self, request: Request) -> Response:
        ids = {}
        for name in ("a", "b"):
            raw = request.query_params.get(name, "")
            if not raw.isdigit() or len(raw) > 18:
                raise ApplicationError(f"`{name}` must be an experiment id.", extra={"fields": {name: ["an id"]}})
            ids[name] = int(raw)
        a, b = experiment_get(experiment_id=ids["a"]), experiment_get(experiment_id=ids["b"])
        return Response(experiments_compare(a=a, b=b))
