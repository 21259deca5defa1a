"""The Celery app as test worker processes load it: the platform's app plus the test-only tools.

``celery -A sessions.tests.celery_test_app worker ...`` (see sessions/tests/test_durability.py).
"""

import sessions.tests.tools_for_tests  # noqa: F401  (registers test_echo, test_sleep, test_append…)
from agent_platform.celery import app

__all__ = ["app"]
