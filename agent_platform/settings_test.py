"""Test settings: the real PostgreSQL and Redis, with a database, keys and a queue of their own.

``TEST_ISOLATION=<name>`` gives a suite its own test database, Redis key prefix and Celery
queue, so two suites can run on one machine at once. Under pytest-xdist (``make test`` runs
the suite on several workers, docs/testing.md) each worker is a suite of its own: the worker's
id (``PYTEST_XDIST_WORKER``, e.g. ``gw0``) extends the Redis key prefix and the queue here, and
pytest-django appends it to the test database's name itself (``test_agent_platform_<tag>_gw0``).
A program a test starts with these settings inherits both variables, so it finds its worker's
keys and queue.

Complete on its own: the keys are set here (test-only keys, which agent_platform/settings.py
refuses outside these settings), whatever the environment or var/secrets.env hold.
"""

import os

from agent_platform.settings import *  # noqa: F403
from agent_platform.settings import CHANNEL_LAYERS, DATABASES

_suffix = os.environ.get("TEST_ISOLATION", "")
_tag = f"_{_suffix}" if _suffix else ""
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_worker_tag = f"{_tag}_{_worker}" if _worker else _tag

# pytest-django adds "_<worker>" to this name in each xdist worker (not repeated here).
DATABASES["default"]["TEST"]["NAME"] = f"test_agent_platform{_tag}"
REDIS_KEY_PREFIX = f"aptest{_worker_tag}"
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = f"{REDIS_KEY_PREFIX}:asgi"
CELERY_TASK_DEFAULT_QUEUE = f"agent_platform_test{_worker_tag}"
# No title requests after a chat's first answer (a test worker would send one more request to the
# fake model server a test scripts); sessions/tests/test_chat_titles.py switches them on.
CHAT_TITLES_FROM_MODEL = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
# Test-only keys (published here, so refused by settings.py anywhere but in these settings).
SECRET_KEY = "test-only-insecure-secret-key-for-the-test-suite-000000000000"
SECRET_KEY_FALLBACKS: list[str] = []
ENCRYPTION_KEY = "dGVzdC1vbmx5LWluc2VjdXJlLW1hc3Rlci1rZXktMzI="  # b"test-only-insecure-master-key-32"
DEBUG = False
# The test process imports the ASGI app for its servers; its collector stays as CPython sets it
# (agent_platform/tests/test_gc_tuning.py tests the tuning itself).
WEB_GC_THRESHOLDS = ()
# The fake LLM server and the test MCP servers listen on 127.0.0.1 (random ports): the outbound
# address rules (capabilities/netsafe.py) let tests reach loopback; tests of the rules set [] .
OUTBOUND_ALLOWED_CIDRS = ["127.0.0.0/8", "::1/128"]
# Abuse controls: the cache's keys under this suite's prefix (the session fixture clears them);
# limits high enough that the rest of the suite never meets them (their own tests lower them
# with the `settings` fixture).
from agent_platform.settings import CACHES  # noqa: E402

CACHES["default"]["KEY_PREFIX"] = f"{REDIS_KEY_PREFIX}:cache"
API_THROTTLE_RATES = {
    "tokens.user": "10000/minute", "tokens.tenant": "10000/minute",
    "messages.user": "10000/minute", "messages.tenant": "10000/minute",
    "runs.user": "10000/minute", "runs.tenant": "10000/minute", "login.ip": "10000/minute",
    "search.user": "10000/minute", "search.tenant": "10000/minute",
}
AXES_FAILURE_LIMIT = 1000
# The test databases commit without waiting for their WAL to reach the disk (a crash could lose
# the last commits, never corrupt them; test databases are thrown away): 3.8 ms → 0.3 ms per
# commit measured on the CI machine, and the suite commits a great deal (every transactional
# test's statements, the run engine's checkpoints, the flush after each transactional test).
# Set on the connection, so the demo database sharing the cluster keeps its durable commits.
if os.environ.get("TEST_SYNCHRONOUS_COMMIT", "off") == "off":
    DATABASES["default"]["OPTIONS"]["options"] = "-c synchronous_commit=off"
