"""Settings, all from the environment with working local defaults.

Environment variables (all optional on a developer machine):
    DATABASE_URL   postgres://… (default: the local cluster, database ``agent_platform``)
    REDIS_URL      redis://… (default redis://127.0.0.1:6379/0): Celery broker, channel layer,
                   event replay streams and run cancel flags
    SECRET_KEY     Django's secret key (a fixed dev value when DEBUG)
    ENCRYPTION_KEY master key wrapping the per-tenant data keys (urlsafe base64, 32 bytes, a
                   Fernet key); a fixed dev value when DEBUG, required otherwise
    DEBUG          "1" (default) or "0"
    ALLOWED_HOSTS  comma-separated (default "127.0.0.1,localhost")
    LLM_BASE_URL   where the embedded model answers (default http://127.0.0.1:8081/v1)
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DEBUG", True)

_DEV_SECRET_KEY = "dev-only-insecure-secret-key-change-me"
_DEV_ENCRYPTION_KEY = "ZGV2LW9ubHktaW5zZWN1cmUtbWFzdGVyLWtleS0zMmI="  # Fernet key, dev only
SECRET_KEY = os.environ.get("SECRET_KEY") or (_DEV_SECRET_KEY if DEBUG else "")
ENCRYPTION_KEY = os.environ.get("ENCRYPTION_KEY") or (_DEV_ENCRYPTION_KEY if DEBUG else "")
if not SECRET_KEY or not ENCRYPTION_KEY:
    raise ImproperlyConfigured("SECRET_KEY and ENCRYPTION_KEY must be set when DEBUG=0")

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "tenants",
    "llm",
    "agents",
    "capabilities",
    "sessions.apps.AgentSessionsConfig",
    "documents",
    "frontend",
    "browser",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "agent_platform.api_errors.ApiErrorShapeMiddleware",  # /api/: every error in {message, extra}
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.middleware.ConsoleScopeMiddleware",  # the database's tenant scope for the console
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "agent_platform.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = None
ASGI_APPLICATION = "agent_platform.asgi.application"

DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default="postgres://postgres@127.0.0.1:5432/agent_platform",
        conn_max_age=0,  # the pool below replaces persistent connections (Django's advice under ASGI)
    )
}
# Django's PostgreSQL backend plus row-level security (tenants/rls.py): every statement runs as
# DATABASE_APP_ROLE, which sees only the rows of the tenant scope in context. The login user
# (DATABASE_URL's) runs migrations and must be able to create that role the first time.
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "agent_platform.postgresql"
DATABASE_APP_ROLE = os.environ.get("DATABASE_APP_ROLE", "agent_platform_app")
# psycopg 3's connection pool (Django ≥ 5.1): connections are reused across requests and across
# the runner's database calls instead of being opened for each. DB_POOL_MAX_SIZE bounds the
# connections one process holds, whatever the number of runs it hosts.
DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
    "min_size": int(os.environ.get("DB_POOL_MIN_SIZE", "1")),
    "max_size": int(os.environ.get("DB_POOL_MAX_SIZE", "10")),
    "timeout": 30,
}
# Server-side parameter binding, and statements a connection runs often prepared (psycopg's
# prepare_threshold: from a statement's 5th run on a connection). Django's default sends every
# query as text with its values inlined, which PostgreSQL parses and plans anew each time:
# ~4 ms of PostgreSQL CPU per run in planning alone with 200 runs at once (pg_stat_statements,
# bench/README.md). DB_SERVER_SIDE_BINDING=0 goes back to Django's default (e.g. behind a
# pooler that cannot hold prepared statements; row-level security needs session pooling anyway).
if os.environ.get("DB_SERVER_SIDE_BINDING", "1") != "0":
    DATABASES["default"]["OPTIONS"].update(server_side_binding=True, prepare_threshold=5)
DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get(
    "TEST_DATABASE_NAME", "test_agent_platform"
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve app static files without collectstatic in development
LOGIN_URL = "/admin/login/"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# Keys this deployment writes to Redis all start with this (tests use their own).
REDIS_KEY_PREFIX = os.environ.get("REDIS_KEY_PREFIX", "ap")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 refuses a 101st pooled connection (MaxConnectionsError); a worker process
            # hosting hundreds of runs publishes from all of them at once.
            # socket_timeout: redis-py 8 defaults it to 5 s, the length of channels_redis's
            # blocking BZPOPMIN, so every idle consumer died with TimeoutError after 5 s
            # (channels_redis#422); 30 s still notices a dead connection.
            "hosts": [{"address": REDIS_URL, "max_connections": int(os.environ.get("REDIS_LAYER_MAX_CONNECTIONS", "512")),
                       "socket_timeout": 30}],
            "prefix": f"{REDIS_KEY_PREFIX}:asgi",
            "capacity": 1000,
            "expiry": 60,
        },
    },
    # Session events (sessions/events.py, EVENTS_LAYER): Redis pub/sub, one PUBLISH per event
    # and one subscription connection per web process; the Redis stream behind every event
    # fills what pub/sub drops (sessions/consumers.py).
    "events": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "prefix": f"{REDIS_KEY_PREFIX}:events",
        },
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [  # JSON nested deeper than 64 levels: 400, never a RecursionError
        "agent_platform.api_parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "agent_platform.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent Platform API",
    "DESCRIPTION": "Multi-tenant AI agent platform: agents, sessions, runs, activities, admin.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "sessions.models.RunStatus",
        "ToolCallStatusEnum": "sessions.models.ToolCallStatus",
    },
}

# Celery: every run is a task; redelivered if a worker dies mid-run.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A run task holds one pool thread while its run works on the worker's run host (the loop does
# the work; the thread only waits), so the pool size is how many runs one worker process carries
# at once. Start workers with `--pool threads` and no `--concurrency` flag to use this.
CELERY_WORKER_CONCURRENCY = int(os.environ.get("WORKER_CONCURRENCY", "200"))
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "agent_platform")
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE = {
    "runs-sweep": {"task": "sessions.runs_sweep", "schedule": float(os.environ.get("RUN_SWEEP_INTERVAL_SECONDS", "15"))},
}

# The worker's run host (sessions/runner/host.py): its event loop ("uvloop" or "asyncio") and
# the GIL switch interval in milliseconds (CPython's default is 5).
RUN_HOST_LOOP = os.environ.get("RUN_HOST_LOOP", "uvloop")
if RUN_HOST_LOOP not in {"uvloop", "asyncio"}:
    raise ImproperlyConfigured('RUN_HOST_LOOP must be "uvloop" or "asyncio"')
RUN_HOST_SWITCH_INTERVAL_MS = float(os.environ.get("RUN_HOST_SWITCH_INTERVAL_MS", "1"))


def _gc_thresholds(name: str, *, may_be_empty: bool) -> tuple[int, ...]:
    """``gc.set_threshold`` values from the environment variable ``name`` ("50000,20,100" if
    unset); empty (``may_be_empty``) means: leave the collector as CPython sets it."""
    raw = os.environ.get(name, "50000,20,100")
    try:
        values = tuple(int(n) for n in raw.split(",") if n.strip())
    except ValueError:
        values = (0,)
    if (values or not may_be_empty) and (len(values) != 3 or min(values) < 1):
        raise ImproperlyConfigured(
            f"{name} must be {'empty or ' if may_be_empty else ''}three positive integers, e.g. 50000,20,100"
        )
    return values


# The worker's garbage-collector thresholds (gc.set_threshold: generation 0, 1, 2), set with
# gc.freeze() when the run host starts (sessions/runner/host.py).
RUN_HOST_GC_THRESHOLDS = _gc_thresholds("RUN_HOST_GC_THRESHOLDS", may_be_empty=False)
# The web process's garbage-collector thresholds, set with gc.freeze() once the ASGI app is
# built (agent_platform/asgi.py); empty: CPython's defaults, nothing frozen.
WEB_GC_THRESHOLDS = _gc_thresholds("WEB_GC_THRESHOLDS", may_be_empty=True)
# Threads that run the runner's ORM calls in a worker process (sessions/runner/_db.py: a run's
# claim and configuration, its end, approvals, compactions).
# Their ORM work holds the GIL the run host's loop needs for streamed tokens; with a database
# on the same host, more than a couple add contention, not throughput (bench/README.md).
# Raise it for a database with a long round trip.
RUN_HOST_DB_THREADS = int(os.environ.get("RUN_HOST_DB_THREADS", "2"))
if RUN_HOST_DB_THREADS < 1:
    raise ImproperlyConfigured("RUN_HOST_DB_THREADS must be at least 1")
# Connections of the run host loop's async pool (sessions/runner/pg.py), which carries a run's
# per-turn statements (history reads, message and tool call writes, heartbeats): the runs wait
# for a free one on the loop, without a thread. And how long a run waits before its step fails.
RUN_HOST_PG_CONNECTIONS = int(os.environ.get("RUN_HOST_PG_CONNECTIONS", "8"))
if RUN_HOST_PG_CONNECTIONS < 1:
    raise ImproperlyConfigured("RUN_HOST_PG_CONNECTIONS must be at least 1")
RUN_HOST_PG_TIMEOUT_SECONDS = float(os.environ.get("RUN_HOST_PG_TIMEOUT_SECONDS", "30"))
# HTTP transport of model streams (llm/providers/openai_compat.py): "aiohttp" (the openai SDK's
# DefaultAioHttpClient: aiohttp's C HTTP parser under the same httpx2 API) or "httpx".
LLM_HTTP_TRANSPORT = os.environ.get("LLM_HTTP_TRANSPORT", "aiohttp")
if LLM_HTTP_TRANSPORT not in {"aiohttp", "httpx"}:
    raise ImproperlyConfigured('LLM_HTTP_TRANSPORT must be "aiohttp" or "httpx"')

# Durable runs (sessions/runner): a running run's worker writes Run.heartbeat_at every
# RUN_HEARTBEAT_SECONDS; the sweeper (Celery beat, every RUN_SWEEP_INTERVAL_SECONDS) resumes a
# run whose heartbeat is older than RUN_STALE_SECONDS, or fails it (worker_lost) after
# RUN_MAX_ATTEMPTS starts.
RUN_HEARTBEAT_SECONDS = float(os.environ.get("RUN_HEARTBEAT_SECONDS", "5"))
RUN_STALE_SECONDS = float(os.environ.get("RUN_STALE_SECONDS", "30"))
RUN_MAX_ATTEMPTS = int(os.environ.get("RUN_MAX_ATTEMPTS", "3"))
RUNS_QUEUE = os.environ.get("RUNS_QUEUE", "")
"""Celery queue for run_execute ("" = CELERY_TASK_DEFAULT_QUEUE)."""
RUNS_PER_TENANT_DEFAULT = int(os.environ.get("RUNS_PER_TENANT_DEFAULT", "50"))
"""Runs of one tenant working at once when the tenant sets no limit; more wait queued."""
APPROVAL_TTL_SECONDS = float(os.environ.get("APPROVAL_TTL_SECONDS", str(24 * 3600)))
"""A pending approval or question expires after this; the run then fails (approval_expired)."""

# The embedded local model (scripts/llm_server.py) that the demo route points at.
LLM_BASE_URL = os.environ.get("LLM_BASE_URL", "http://127.0.0.1:8081/v1")
LLM_MODEL_NAME = os.environ.get("LLM_MODEL_NAME", "qwen2.5-coder-0.5b-instruct")

# web_fetch / web_read (capabilities/netsafe.py): networks allowed although not public. Empty in
# production; tests add 127.0.0.1/32 to reach their own servers. Metadata addresses stay blocked.
# An invalid network fails at startup (ValueError), not at the first fetch.
WEB_FETCH_ALLOWED_CIDRS: list[str] = [
    str(ipaddress.ip_network(c.strip(), strict=False))
    for c in os.environ.get("WEB_FETCH_ALLOWED_CIDRS", "").split(",") if c.strip()
]
WEB_FETCH_CONNECT_TIMEOUT_SECONDS = 5.0
WEB_FETCH_TOTAL_TIMEOUT_SECONDS = 20.0

# MCP client pool (capabilities/mcp/pool.py): one per worker process, on the run-host loop.
MCP_POOL_IDLE_TIMEOUT_SECONDS = float(os.environ.get("MCP_POOL_IDLE_TIMEOUT_SECONDS", "300"))
MCP_POOL_CATALOGUE_TTL_SECONDS = float(os.environ.get("MCP_POOL_CATALOGUE_TTL_SECONDS", "300"))
MCP_POOL_BREAKER_FAILURE_THRESHOLD = int(os.environ.get("MCP_POOL_BREAKER_FAILURE_THRESHOLD", "3"))
MCP_POOL_BREAKER_COOLDOWN_SECONDS = float(os.environ.get("MCP_POOL_BREAKER_COOLDOWN_SECONDS", "30"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"httpx": {"level": "WARNING"}, "httpx2": {"level": "WARNING"}, "mcp": {"level": "WARNING"}},
}

# CLI capabilities: the bubblewrap executable (a name on PATH or a path). Missing: sandboxed
# CLI commands refuse to run (README, "CLI commands").
CLI_BWRAP_PATH = os.environ.get("CLI_BWRAP_PATH", "bwrap")

# --- Browser capability (browser/) -------------------------------------------------------------
# Chrome extension ids allowed to open /ws/browser/ (Origin chrome-extension://<id>). The default
# is the id fixed by the "key" in chrome_extension/manifest.json.
BROWSER_EXTENSION_IDS = [
    i.strip() for i in os.environ.get("BROWSER_EXTENSION_IDS", "mbcfbjmfgndlpbhnffdhmbecjdjpeeok").split(",") if i.strip()
]
BROWSER_PAIRING_TTL_SECONDS = 600
BROWSER_PAIRING_RATE_LIMIT = 30  # pairings per client IP per 10 minutes
BROWSER_PAIRING_POLL_RATE_LIMIT = 600  # token polls per client IP per 10 minutes
BROWSER_PAIRING_APPROVE_RATE_LIMIT = 20  # code attempts per user per 10 minutes
BROWSER_CHROMIUM_PATH = os.environ.get("BROWSER_CHROMIUM_PATH", "/usr/lib/chromium/chromium")
BROWSER_SERVER_IDLE_SECONDS = int(os.environ.get("BROWSER_SERVER_IDLE_SECONDS", "600"))
BROWSER_SERVER_HEADLESS = True
