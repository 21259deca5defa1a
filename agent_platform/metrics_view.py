"""``GET /metrics``: the Prometheus metrics of every process, for the operator only.

Served only when the ``METRICS_BEARER_TOKEN`` setting is non-empty, and then only to a request
with ``Authorization: Bearer <that token>`` (compared in constant time): without the setting
the path is a 404 (as if it did not exist), with a missing or wrong token a 401 with
``WWW-Authenticate: Bearer``. The body is the Prometheus text format (version 0.0.4).

What it holds: the metrics of :mod:`agent_platform.metrics` (summed over every process that
shares ``PROMETHEUS_MULTIPROC_DIR``, else this process's own), and gauges read live at each
scrape, across all tenants:

- ``agent_platform_runs{status}``: runs queued, running and awaiting approval now;
- ``agent_platform_approvals_waiting``: approvals (and questions) pending a human;
- ``agent_platform_celery_queue_length{queue}``: messages waiting in the run queue and the
  default queue (the Redis broker's list lengths).

A failed live read (database or Redis down) leaves that gauge out and never fails the scrape.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from agent_platform import metrics

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LIVE_GAUGES = ("agent_platform_runs", "agent_platform_approvals_waiting", "agent_platform_celery_queue_length")
"""The gauges :class:`LiveStateCollector` reads at each scrape."""


def _authorized(request: HttpRequest, token: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


class LiveStateCollector:
    """The gauges read at scrape time from PostgreSQL and Redis (see the module docstring)."""

    def collect(self) -> Iterator[Any]:
        yield from self._runs()
        yield from self._queues()

    def describe(self) -> list[Any]:
        return []  # not registered for its description: collected at each scrape only

    @staticmethod
    def _runs() -> Iterator[Any]:
        from django.db.models import Count

        from sessions.models import ACTIVE_RUN_STATUSES, Approval, ApprovalStatus, Run
        from tenants.scoping import system_scope

        try:
            # tenant-bypass: the operator's totals over every tenant (counts only, no rows leave).
            with system_scope():
                by_status = dict(Run.all_tenants.filter(status__in=ACTIVE_RUN_STATUSES)
                                 .values_list("status").annotate(n=Count("id")).values_list("status", "n"))
                waiting = Approval.all_tenants.filter(status=ApprovalStatus.PENDING).count()
        except Exception:  # noqa: BLE001 - a scrape must not fail for one gauge
            logger.warning("metrics: cannot read runs and approvals", exc_info=True)
            return
        runs = GaugeMetricFamily("agent_platform_runs", "Runs not yet ended, by status (all tenants).",
                                 labels=["status"])
        for status in ACTIVE_RUN_STATUSES:
            runs.add_metric([str(status)], by_status.get(status, 0))
        yield runs
        yield GaugeMetricFamily("agent_platform_approvals_waiting", "Approvals and questions waiting for a human.",
                                value=waiting)

    @staticmethod
    def _queues() -> Iterator[Any]:
        import redis

        queues = sorted({settings.RUNS_QUEUE or settings.CELERY_TASK_DEFAULT_QUEUE, settings.CELERY_TASK_DEFAULT_QUEUE})
        try:
            client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
            try:
                lengths = [(q, client.llen(q)) for q in queues]
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - a scrape must not fail for one gauge
            logger.warning("metrics: cannot read the queue lengths", exc_info=True)
            return
        family = GaugeMetricFamily("agent_platform_celery_queue_length",
                                   "Celery messages waiting in the broker, by queue.", labels=["queue"])
        for queue, length in lengths:
            family.add_metric([queue], length)
        yield family


def metrics_registry() -> CollectorRegistry:
    """The registry a scrape renders: every process's metrics (multiprocess mode) or this
    process's, plus :class:`LiveStateCollector`."""
    registry = CollectorRegistry()
    if metrics.multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in metrics.ALL_METRICS:
            registry.register(collector)
    registry.register(LiveStateCollector())
    return registry


@csrf_exempt
@require_GET
def metrics_endpoint(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape (see the module docstring): 404 when ``METRICS_BEARER_TOKEN`` is
    unset, 401 for a missing or wrong bearer token, else 200 with the text format."""
    token = settings.METRICS_BEARER_TOKEN
    if not token:
        return HttpResponse("Not found.", status=404, content_type="text/plain")
    if not _authorized(request, token):
        response = HttpResponse("A valid bearer token is required.", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE)
