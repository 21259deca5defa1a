"""The Celery app. Workers run with a thread pool; runs themselves are asyncio coroutines
hosted on one event loop per worker process (see ``sessions.runner.host``)."""

import os

from celery import Celery
from celery.signals import worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

app = Celery("agent_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_shutdown.connect
def _close_run_host(**_: object) -> None:
    """Close the worker's run host: MCP stdio servers are terminated, HTTP pools closed."""
    from sessions.runner.host import run_host_shutdown

    run_host_shutdown()
