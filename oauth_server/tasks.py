"""Celery tasks of the authorization server.

- ``oauth_server.cleanup`` (beat, ``CELERY_BEAT_SCHEDULE["oauth-cleanup"]``, hourly):
  :func:`oauth_server.services.oauth_cleanup`.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="oauth_server.cleanup", ignore_result=True, soft_time_limit=600, time_limit=660)
def oauth_cleanup() -> dict[str, int]:
    """:func:`oauth_server.services.oauth_cleanup` now: ``{"consents", "grants", "clients"}``."""
    from oauth_server.services import oauth_cleanup as cleanup

    return cleanup()
