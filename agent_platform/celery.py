"""The Celery app. Workers run with a thread pool; runs themselves are asyncio coroutines
hosted on one event loop per worker process (see ``sessions.runner.host``)."""

import os

from celery import Celery
from celery.signals import worker_init, worker_shutdown

from agent_platform import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

app = Celery("agent_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
metrics.celery_signals_connect()  # queue wait and run time of every task (agent_platform/metrics.py)


@worker_init.connect
def _configure_tracing(**_: object) -> None:
    """Traces when OTEL_EXPORTER_OTLP_ENDPOINT is set (agent_platform/telemetry.py): task spans
    continue the trace whose context came in the message's headers."""
    from agent_platform import telemetry
    from tenants.context import current_tenant_id

    telemetry.configure(service_name="agent-platform-worker", tenant_of=current_tenant_id)


@worker_shutdown.connect
def _close_run_host(**_: object) -> None:
    """Close the worker's run host: MCP stdio servers are terminated, HTTP pools closed."""
    from sessions.runner.host import run_host_shutdown

    run_host_shutdown()
    metrics.process_exited()  # its live gauges (MCP sessions) leave the multiprocess sums
