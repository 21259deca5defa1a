"""The console's evaluation pages (Django admin, tenant-scoped): datasets with their items,
experiments started from the console (or the API, or ``manage.py evaluate``) with their results
(each linked to its run's trace), and the comparison of two experiments with a chart."""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
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
    list_display = ["name", "items", "description", "updated_at", "start_link", "tenant"]
    search_fields = ["name", "description"]
    inlines = [DatasetItemInline]

    @admin.display(description="experiment")
    def start_link(self, obj: Dataset) -> str:
        return format_html(
            '<a href="{}?dataset={}">Start an experiment</a>', reverse("admin:evaluation_experiment_start"), obj.pk
        )

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


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _start_options(form: Any) -> dict[str, Any]:
    """The start form's numbers and scorers as :func:`experiment_create` takes them.

    Raises:
        ApplicationError: a number that is not one, or scorers that are not a JSON list.
    """
    options: dict[str, Any] = {}
    for name, default, low, high in (("repetitions", 1, 1, 20), ("max_concurrency", 4, 1, 64)):  # the model's bounds
        value = _int_or_none(form.get(name) or default)
        if value is None or not low <= value <= high:
            raise ApplicationError(f"{name.replace('_', ' ').capitalize()}: a whole number from {low} to {high}.")
        options[name] = value
    cap = (form.get("max_cost_usd") or "").strip()
    if cap:
        try:
            options["max_cost_usd"] = Decimal(cap)
        except InvalidOperation:
            raise ApplicationError("Cost cap: a number of US dollars, e.g. 0.50.") from None
        if options["max_cost_usd"] <= 0:
            raise ApplicationError("Cost cap: more than 0 US dollars, or empty for none.")
    scorers = (form.get("scorers") or "").strip()
    if scorers:
        try:
            options["scorers"] = json.loads(scorers)
        except ValueError as exc:
            raise ApplicationError(f"Scorers: not JSON ({exc}).") from None
    return options


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
            path("start/", self.admin_site.admin_view(self.start_view), name="evaluation_experiment_start"),
        ]
        return urls + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The list, with a "Start an experiment" link above it."""
        return super().changelist_view(
            request, {**(extra_context or {}), "start_url": reverse("admin:evaluation_experiment_start")}
        )

    def start_view(self, request: HttpRequest) -> HttpResponse:
        """Start an experiment: GET a form (the user's tenants' datasets and active agents,
        ``?dataset=`` preselects one), POST starts it (:func:`evaluation.services.experiment_create`)
        and opens its results page. A dataset or agent of a tenant the user does not administer is
        a 404; bad numbers, invalid scorers or an agent of another tenant than the dataset's are
        the form again with the message."""
        from agents.models import AgentInstance

        tenants = admin_tenants(request)
        datasets = Dataset.all_tenants.order_by("name")  # tenant-bypass: limited to the user's tenants below
        agents = AgentInstance.all_tenants.filter(is_active=True).order_by("name")  # tenant-bypass: as datasets
        if not request.user.is_superuser:
            datasets, agents = datasets.filter(tenant_id__in=tenants), agents.filter(tenant_id__in=tenants)
        values = request.POST if request.method == "POST" else request.GET
        if request.method == "POST":
            started = self._start(request, datasets, agents)
            if started is not None:
                return started
        return TemplateResponse(
            request,
            "evaluation/experiment_start.html",
            {
                **self._context(request, "Start an experiment"),
                "datasets": datasets,
                "agents": agents,
                "values": values,
            },
        )

    def _start(self, request: HttpRequest, datasets: Any, agents: Any) -> HttpResponse | None:
        from evaluation.services import experiment_create

        dataset = datasets.filter(pk=_int_or_none(request.POST.get("dataset"))).first()
        agent = agents.filter(pk=_int_or_none(request.POST.get("agent"))).first()
        if dataset is None or agent is None:
            raise Http404("Not found.")
        try:
            options = _start_options(request.POST)
            with tenant_scope(dataset.tenant_id):
                experiment = experiment_create(dataset=dataset, agent=agent, user=request.user, **options)
        except ApplicationError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return None
        self.message_user(request, f"Experiment {experiment.pk} started.", messages.SUCCESS)
        return redirect("admin:evaluation_experiment_results", experiment.pk)

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
