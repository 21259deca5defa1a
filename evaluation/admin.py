"""The console's evaluation pages (Django admin, tenant-scoped): datasets with their items,
experiments with their results (each linked to its run's trace), and the comparison of two
experiments with a chart. Starting an experiment is the API's or ``manage.py evaluate``'s."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from agent_platform.api_errors import ApplicationError
from evaluation.models import Dataset, DatasetItem, Experiment, ExperimentResult
from evaluation.selectors import experiments_compare
from tenants.admin_scoping import TenantScopedInline, TenantScopedModelAdmin, admin_tenants
from tenants.scoping import tenant_scope

CHART_BAR_WIDTH = 10
CHART_GAP = 8
CHART_HEIGHT = 120


class DatasetItemInline(TenantScopedInline):
    model = DatasetItem
    fields = ["input", "expected", "metadata", "source_run"]
    readonly_fields = ["source_run"]


@admin.register(Dataset)
class DatasetAdmin(TenantScopedModelAdmin):
    list_display = ["name", "items", "description", "updated_at", "tenant"]
    search_fields = ["name", "description"]
    inlines = [DatasetItemInline]

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(item_count=Count("items"))

    @admin.display(description="items", ordering="item_count")
    def items(self, obj: Dataset) -> int:
        return obj.item_count

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "add-run/<int:run_id>/",
                self.admin_site.admin_view(self.add_run_view),
                name="evaluation_dataset_add_run",
            )
        ]
        return urls + super().get_urls()

    def add_run_view(self, request: HttpRequest, run_id: int) -> HttpResponse:
        """ "Add to a dataset" from a run's trace: GET a choice of the run's tenant's datasets (or
        a new one's name); POST adds the run as an item (input: the user's message, reference:
        the reply; :func:`evaluation.services.dataset_item_from_run`). 404 for a run the user
        may not administer."""
        from sessions.models import Run

        runs = Run.all_tenants.filter(pk=run_id)  # tenant-bypass: limited to the user's tenants below
        if not request.user.is_superuser:
            runs = runs.filter(tenant_id__in=admin_tenants(request))
        run = runs.first()
        if run is None:
            raise Http404("Not found.")
        datasets = self.get_queryset(request).filter(tenant_id=run.tenant_id).order_by("name")
        if request.method == "POST":
            return self._add_run(request, run, datasets)
        return TemplateResponse(
            request,
            "evaluation/add_run.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": f"Add run {run.pk} to a dataset",
                "run": run,
                "datasets": datasets,
            },
        )

    def _add_run(self, request: HttpRequest, run: Any, datasets: Any) -> HttpResponse:
        from evaluation.services import dataset_item_from_run, dataset_save
        from tenants.models import Tenant

        back = redirect("admin:evaluation_dataset_add_run", run.pk)
        with tenant_scope(run.tenant_id):
            try:
                name = (request.POST.get("new_name") or "").strip()
                if name:
                    dataset = dataset_save(tenant=Tenant.objects.get(pk=run.tenant_id), name=name[:200])
                else:
                    dataset = datasets.filter(pk=request.POST.get("dataset") or 0).first()
                if dataset is None:
                    self.message_user(request, "Pick a dataset or name a new one.", messages.ERROR)
                    return back
                item = dataset_item_from_run(dataset=dataset, run=run)
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.ERROR)
                return back
        self.message_user(request, f"Run {run.pk} added to “{dataset.name}” as item {item.pk}.", messages.SUCCESS)
        return redirect("admin:evaluation_dataset_change", dataset.pk)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f} %"


def compare_chart(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison chart's geometry: per item two bars (A, B: pass rate, 0..1 → height),
    in the rows' order (regressions first). Returns ``{width, height, groups: [{item, change,
    x, a: {y, h, value}, b: {...}}]}``."""
    groups = []
    for i, row in enumerate(rows):
        x = i * (2 * CHART_BAR_WIDTH + CHART_GAP)
        bars = {}
        for side in ("a", "b"):
            value = (row[side] or {}).get("pass_rate")
            height = round((value or 0) * CHART_HEIGHT)
            bars[side] = {"y": CHART_HEIGHT - height, "h": height, "value": _pct(value)}
        groups.append({"item": row["item"], "change": row["change"], "x": x, "xb": x + CHART_BAR_WIDTH, **bars})
    width = max(1, len(rows) * (2 * CHART_BAR_WIDTH + CHART_GAP))
    return {"width": width, "height": CHART_HEIGHT, "bar": CHART_BAR_WIDTH, "groups": groups}


@admin.register(Experiment)
class ExperimentAdmin(TenantScopedModelAdmin):
    search_fields = ["dataset__name", "agent__name", "status"]
    read_only_model = True
    list_display = [
        "id",
        "results_link",
        "dataset",
        "agent",
        "status",
        "pass_rate",
        "interval",
        "cost",
        "created_at",
        "tenant",
    ]
    list_display_links = None
    list_filter = ["status"]
    list_select_related = ["dataset", "agent", "tenant"]
    actions = ["compare_selected"]

    def get_urls(self) -> list[Any]:
        urls = [
            path(
                "<int:object_id>/results/",
                self.admin_site.admin_view(self.results_view),
                name="evaluation_experiment_results",
            ),
            path("compare/", self.admin_site.admin_view(self.compare_view), name="evaluation_experiment_compare"),
        ]
        return urls + super().get_urls()

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """An experiment opens as its results page."""
        return redirect("admin:evaluation_experiment_results", object_id)

    @admin.display(description="experiment")
    def results_link(self, obj: Experiment) -> str:
        return format_html(
            '<a href="{}">Experiment {}</a>', reverse("admin:evaluation_experiment_results", args=[obj.pk]), obj.pk
        )

    @admin.display(description="pass rate")
    def pass_rate(self, obj: Experiment) -> str:
        return _pct(obj.summary.get("pass_rate"))

    @admin.display(description="95 % interval")
    def interval(self, obj: Experiment) -> str:
        low_high = obj.summary.get("pass_rate_ci95")
        return f"{low_high[0] * 100:.0f}–{low_high[1] * 100:.0f} %" if low_high else "–"

    @admin.display(description="cost (USD)")
    def cost(self, obj: Experiment) -> str:
        return f"{obj.summary.get('cost_usd', 0):.4f}"

    @admin.action(description="Compare the two selected experiments (the older is the baseline)")
    def compare_selected(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        ids = sorted(queryset.values_list("pk", flat=True))
        if len(ids) != 2:
            self.message_user(request, "Select exactly two experiments.", messages.WARNING)
            return None
        return redirect(f"{reverse('admin:evaluation_experiment_compare')}?a={ids[0]}&b={ids[1]}")

    def _experiment(self, request: HttpRequest, object_id: Any) -> Experiment:
        try:
            pk = int(object_id)
        except (TypeError, ValueError):
            raise Http404("Not found.") from None
        experiment = self.get_queryset(request).filter(pk=pk).select_related("dataset", "agent").first()
        if experiment is None or not self.has_view_permission(request, experiment):
            raise Http404("Not found.")
        return experiment

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "has_view_permission": True,
        }

    def results_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """An experiment's summary and its results, each linked to its run's trace."""
        experiment = self._experiment(request, object_id)
        results = (
            ExperimentResult.all_tenants.filter(experiment=experiment, tenant_id=experiment.tenant_id)
            .select_related("item")
            .order_by("passed", "item_id", "repetition")
        )
        return TemplateResponse(
            request,
            "evaluation/experiment_results.html",
            {
                **self._context(request, f"Experiment {experiment.pk}: {experiment.dataset} × {experiment.agent}"),
                "experiment": experiment,
                "summary": experiment.summary,
                "results": results,
            },
        )

    def compare_view(self, request: HttpRequest) -> HttpResponse:
        """Experiment ``?b=`` against ``?a=`` item by item, regressions first, with a chart."""
        a = self._experiment(request, request.GET.get("a"))
        b = self._experiment(request, request.GET.get("b"))
        if a.tenant_id != b.tenant_id:
            raise Http404("Not found.")
        with tenant_scope(a.tenant_id):
            try:
                compared = experiments_compare(a=a, b=b)
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.ERROR)
                return redirect("admin:evaluation_experiment_changelist")
        return TemplateResponse(
            request,
            "evaluation/experiment_compare.html",
            {
                **self._context(request, f"Experiment {b.pk} against {a.pk}"),
                "a": a,
                "b": b,
                "compared": compared,
                "chart": compare_chart(compared["items"]),
            },
        )
