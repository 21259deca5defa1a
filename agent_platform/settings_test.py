"""Test settings: the real PostgreSQL and Redis, with keys and queues of their own."""

from agent_platform.settings import *  # noqa: F403
from agent_platform.settings import CHANNEL_LAYERS

REDIS_KEY_PREFIX = "aptest"
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = "aptest:asgi"
CELERY_TASK_DEFAULT_QUEUE = "agent_platform_test"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
