"""The Celery app. Workers run with a thread pool; runs themselves are asyncio coroutines
hosted on one event loop per worker process (see ``sessions.runner.host``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agent_platform.settings")

app = Celery("agent_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
