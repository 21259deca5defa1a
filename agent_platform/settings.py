"""Settings, all from the environment with working local defaults.

Environment variables (all optional on a developer machine that ran scripts/bootstrap.sh):
    SECRET_KEY     Django's secret key. Required: from the environment, else from the install's
                   secrets file (agent_platform/local_secrets.py; written once by
                   scripts/bootstrap.sh, mode 0600; beside the machine's local PostgreSQL, e.g.
                   /var/lib/agent-platform/secrets.env, or var/secrets.env with DATABASE_URL).
                   The keys published in this repository are refused, with DEBUG on or off.
    SECRET_KEY_FALLBACKS  comma-separated previous SECRET_KEYs (rotation: sessions and signed
                   values made with them stay valid until removed)
    ENCRYPTION_KEY master key(s) wrapping the per-tenant data keys: comma-separated Fernet keys
                   (urlsafe base64 of 32 bytes), the first encrypts, all decrypt; required, as
                   SECRET_KEY. Rotation: put a new key first, run
                   ``manage.py rotate_encryption_key``, then drop the old key.
    DATABASE_URL   postgres://… the application's login: a role held to row-level security
                   (NOSUPERUSER NOBYPASSRLS; tenants/rls.py). Default: DATABASE_APP_ROLE with
                   DATABASE_APP_PASSWORD (environment or secrets file) on 127.0.0.1:5433,
                   database ``agent_platform``
    DATABASE_OWNER_URL  postgres://… the login that owns the tables and runs ``migrate``,
                   ``flush`` and the test database's creation (default: user ``postgres`` on
                   DATABASE_URL's host, no password). Only its user, password, host and port are
                   used: the database is DATABASE_URL's.
    REDIS_URL      redis://… (default redis://127.0.0.1:6379/0): Celery broker, channel layer,
                   event replay streams and run cancel flags
    DEBUG          "0" (default) or "1"
    ALLOWED_HOSTS  comma-separated (default "127.0.0.1,localhost")
    LLM_BASE_URL   where the embedded model answers (default http://127.0.0.1:8081/v1)
    LLM_LARGE_BASE_URL  where the larger embedded model answers (default http://127.0.0.1:8083/v1;
                   empty: none)
    EMBEDDINGS_BASE_URL  where the embedded embedding model answers (default http://127.0.0.1:8082/v1)
    TLS deployment: SESSION_COOKIE_SECURE, CSRF_COOKIE_SECURE, SECURE_SSL_REDIRECT,
                   SECURE_HSTS_SECONDS (+ SECURE_HSTS_INCLUDE_SUBDOMAINS, SECURE_HSTS_PRELOAD),
                   SECURE_PROXY_SSL_HEADER ("HTTP_X_FORWARDED_PROTO,https"; opt-in), and
                   CONTENT_SECURITY_POLICY (see the security headers below)
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from agent_platform import local_secrets
from agent_platform.sandbox_paths import machine_sandbox_root, sandbox_venv

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DEBUG", False)

# Keys: from the environment, else from the per-install secrets file (var/secrets.env, 0600,
# generated once by scripts/bootstrap.sh: agent_platform/local_secrets.py). Nothing falls back
# to a key written in the source. The former development defaults stay refused (a database
# whose tenants were wrapped by _DEV_ENCRYPTION_KEY is migrated by
# ``manage.py rotate_encryption_key --from-published-dev-key``, which bootstrap runs).
_DEV_SECRET_KEY = local_secrets.PUBLISHED_DEV_SECRET_KEY  # published: refused
_DEV_ENCRYPTION_KEY = local_secrets.PUBLISHED_DEV_ENCRYPTION_KEY  # published: refused
# The test settings (agent_platform/settings_test.py) set test keys of their own after this.
_TEST_SETTINGS = os.environ.get("DJANGO_SETTINGS_MODULE") == "agent_platform.settings_test"
try:
    _SECRETS_FILE_VALUES = local_secrets.read(local_secrets.path_from_environment())
except local_secrets.SecretsFileError as exc:
    raise ImproperlyConfigured(str(exc)) from None


def _secret(name: str) -> str:
    """``name`` from the environment, else from the secrets file, else ""."""
    return local_secrets.lookup(name, _SECRETS_FILE_VALUES)


SECRET_KEY = _secret("SECRET_KEY")
SECRET_KEY_FALLBACKS = [k.strip() for k in _secret("SECRET_KEY_FALLBACKS").split(",") if k.strip()]
ENCRYPTION_KEY = _secret("ENCRYPTION_KEY")
if not _TEST_SETTINGS:
    _KEYS_HELP = ("run scripts/bootstrap.sh (make run does) to generate "
                  f"{local_secrets.path_from_environment() or 'the secrets file'}, or set SECRET_KEY and "
                  "ENCRYPTION_KEY in the environment (docs/operations-security.md, \"Key handling\")")
    if not SECRET_KEY or not ENCRYPTION_KEY:
        raise ImproperlyConfigured(f"SECRET_KEY and ENCRYPTION_KEY are not set: {_KEYS_HELP}")
    if any(local_secrets.published_secret_key(k) for k in (SECRET_KEY, *SECRET_KEY_FALLBACKS)):
        raise ImproperlyConfigured(f"SECRET_KEY is a key published in the source code: {_KEYS_HELP}")
    if len(SECRET_KEY) < 32:
        raise ImproperlyConfigured(f"SECRET_KEY is shorter than 32 characters: {_KEYS_HELP}")
    _problem = local_secrets.encryption_key_problem(ENCRYPTION_KEY)
    if _problem:
        raise ImproperlyConfigured(f"{_problem}: {_KEYS_HELP}")

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
# Comma-separated origins (https://<host>) whose POSTs pass the CSRF check: needed behind a
# TLS-terminating proxy that does not pass the scheme on.
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

# --- Security headers and TLS (docs/operations-security.md, "Deployment settings") ------------
# Behind TLS set SESSION_COOKIE_SECURE=1 CSRF_COOKIE_SECURE=1 SECURE_SSL_REDIRECT=1 and
# SECURE_HSTS_SECONDS (e.g. 31536000 once HTTPS works everywhere: browsers remember it).
SESSION_COOKIE_SECURE = _env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = _env_bool("CSRF_COOKIE_SECURE", False)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", False)
try:
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0"))
except ValueError:
    raise ImproperlyConfigured("SECURE_HSTS_SECONDS must be an integer number of seconds") from None
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)  # HSTS for every subdomain too
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", False)  # HSTS "preload" (browsers' built-in lists)
# Opt-in, only behind a proxy that sets this header itself (else a client could claim HTTPS):
# "HTTP_X_FORWARDED_PROTO,https". (uvicorn's --proxy-headers --forwarded-allow-ips does the same
# at the server.)
_proxy_ssl_header = [p.strip() for p in os.environ.get("SECURE_PROXY_SSL_HEADER", "").split(",") if p.strip()]
if _proxy_ssl_header and (len(_proxy_ssl_header) != 2 or not _proxy_ssl_header[0].startswith("HTTP_")):
    raise ImproperlyConfigured('SECURE_PROXY_SSL_HEADER must look like "HTTP_X_FORWARDED_PROTO,https"')
SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header) if _proxy_ssl_header else None
SECURE_CONTENT_TYPE_NOSNIFF = True  # X-Content-Type-Options: nosniff
SECURE_REFERRER_POLICY = os.environ.get("SECURE_REFERRER_POLICY", "same-origin")  # the Referrer-Policy header
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (agent_platform/security_headers.py). The chat app
# and the console load scripts and styles only from this origin and run no inline script.
CONTENT_SECURITY_POLICY = os.environ.get("CONTENT_SECURITY_POLICY") or (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
# Path prefixes served with another policy: Swagger UI's page (drf-spectacular's split view, whose
# start-up script is a file of its own) has an inline <style> element; its scripts stay 'self'.
CONTENT_SECURITY_POLICY_PATHS = {
    "/api/docs/": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
}

INSTALLED_APPS = [
    "console",  # the console's pages and admin templates (before django.contrib.admin: its templates win)
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
    "axes",  # login lockout (django-axes; AXES_* below)
    "tenants",
    "tenants.oidc",  # single sign-on with OpenID Connect (off unless OIDC_ENABLED; OIDC_* below)
    "llm",
    "agents",
    "capabilities",
    "sessions.apps.AgentSessionsConfig",
    "documents",
    "frontend",
    "browser",
    "knowledge",  # knowledge bases: documents, chunks (pgvector + full text), hybrid retrieval
    "memory",  # long-term memory per user and agent (the memory capability kind)
    "evaluation",  # datasets and experiments: how good an agent's answers are (issue 38)
    "oauth2_provider",  # django-oauth-toolkit: the OAuth 2.1 authorization server of the MCP endpoints
    "oauth_server",  # its configuration for MCP: consent with a tenant choice, resource-bound tokens
    "automations",  # schedules (cron per agent) and inbound webhook triggers (issue 40)
    "guardrails",  # per-agent checks of a run's input, tool calls, tool results and output (issue 39)
]

MIDDLEWARE = [
    "agent_platform.metrics.HttpMetricsMiddleware",  # request latency by view (agent_platform/metrics.py)
    "django.middleware.security.SecurityMiddleware",
    "agent_platform.security_headers.ContentSecurityPolicyMiddleware",  # CSP, static files included
    "agent_platform.api_errors.ApiErrorShapeMiddleware",  # /api/: every error in {message, extra}
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.middleware.ConsoleScopeMiddleware",  # the database's tenant scope for the console
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # a locked-out login attempt answers 429 (tenants/lockout.py)
    # Last: the chain above runs sync, in the request's thread, under ASGI too (one thread
    # hand-off instead of two per middleware; agent_platform/middleware_chain.py).
    "agent_platform.middleware_chain.SyncChainEnd",
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

# Two PostgreSQL logins (tenants/rls.py; docs/operations-security.md, "Database roles"):
# - DATABASE_URL, the application's: DATABASE_APP_ROLE (agent_platform_app), a LOGIN role with
#   a password, NOSUPERUSER NOBYPASSRLS, owning nothing, so every row-level security policy
#   applies to it; it sees only the rows of the tenant scope in context. The backend refuses a
#   login that is a superuser or bypasses row-level security.
# - DATABASE_OWNER_URL, the owner's (default: postgres on the same host, no password): owns the
#   tables, runs migrate/flush and creates the test database (tenants.rls.owner_mode). The web
#   and worker processes never need it.
# scripts/ensure_database.py (bootstrap) creates the role with DATABASE_APP_PASSWORD from
# var/secrets.env. conn_max_age=0: the pool below replaces persistent connections.
DATABASE_APP_ROLE = os.environ.get("DATABASE_APP_ROLE", local_secrets.DEFAULT_APP_ROLE)
try:
    _app_login, _owner_login = local_secrets.database_logins(_SECRETS_FILE_VALUES)
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
DATABASES = {"default": {**_app_login, "OWNER": _owner_login}}
# Django's PostgreSQL backend plus row-level security (tenants/rls.py).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "agent_platform.postgresql"
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
    # Session events use no channel layer: the publish script PUBLISHes on the session's own
    # Redis channel and each web process reads them from one subscription (sessions/events.py,
    # sessions/live.py); the Redis stream behind every event fills what pub/sub drops.
}

# Django's cache: Redis (DRF throttles, django-axes' failure counters), keys under REDIS_KEY_PREFIX.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{REDIS_KEY_PREFIX}:cache",
    },
}

# --- Abuse controls (tenants/throttling.py, tenants/lockout.py; docs/operations-security.md) ------
# API throttles per user and per tenant, "<scope>.<user|tenant>": "<n>/<second|minute|hour|day>".
# Scopes: tokens (POST /tokens/), messages (POST /sessions/<id>/messages/), runs (requests that
# start or resume a run: messages, approval decisions), search (knowledge searches: POST
# /knowledge-bases/<id>/search/ and the knowledge MCP server's knowledge_search; each embeds the
# query), login.ip (POST /auth/login/ per client address), mcp_auth.ip (failed API-token checks
# of the knowledge MCP server per client address; over it: 429 before the token is looked at),
# a2a_auth.ip (the same at the A2A servers).
# An empty value turns a limit off.
# A throttled caller gets 429 with Retry-After and the {message, extra} body.
API_THROTTLE_RATES = {
    "tokens.user": os.environ.get("THROTTLE_TOKENS_USER", "20/hour"),
    "tokens.tenant": os.environ.get("THROTTLE_TOKENS_TENANT", "200/hour"),
    "messages.user": os.environ.get("THROTTLE_MESSAGES_USER", "30/minute"),
    "messages.tenant": os.environ.get("THROTTLE_MESSAGES_TENANT", "300/minute"),
    "runs.user": os.environ.get("THROTTLE_RUNS_USER", "60/minute"),
    "runs.tenant": os.environ.get("THROTTLE_RUNS_TENANT", "600/minute"),
    "search.user": os.environ.get("THROTTLE_SEARCH_USER", "120/minute"),
    "search.tenant": os.environ.get("THROTTLE_SEARCH_TENANT", "1200/minute"),
    "login.ip": os.environ.get("THROTTLE_LOGIN_IP", "60/minute"),  # login attempts per client address
    # failed token checks per client address at the MCP servers, /mcp/knowledge/ and /mcp/agents/
    # (agent_platform/mcp_http.py)
    "mcp_auth.ip": os.environ.get("THROTTLE_MCP_AUTH_IP", "30/minute"),
    # failed token checks per client address at the agents' A2A servers, /a2a/<slug>/ (sessions/api/a2a/app.py)
    "a2a_auth.ip": os.environ.get("THROTTLE_A2A_AUTH_IP", "30/minute"),
    # OAuth client registrations (RFC 7591, POST /oauth/register/) per client address (oauth_server)
    "oauth_register.ip": os.environ.get("THROTTLE_OAUTH_REGISTER_IP", "20/hour"),
}
# Login lockout (django-axes) on /api/v1/auth/login/ and /admin/login/: after
# LOGIN_LOCKOUT_FAILURES failed logins for one username from one IP address (LOGIN_LOCKOUT_BY:
# "username_ip" (default), "username" or "ip"), that pair is refused (429, Retry-After) for
# LOGIN_LOCKOUT_MINUTES, even with the right password. A successful login resets the count.
AUTHENTICATION_BACKENDS = [
    "tenants.lockout.LockoutBackend",  # axes' check first: a locked-out attempt never reaches the password
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "axes.handlers.cache.AxesCacheHandler"  # failure counters in the Redis cache above
AXES_FAILURE_LIMIT = int(os.environ.get("LOGIN_LOCKOUT_FAILURES", "10"))
AXES_COOLOFF_TIME = float(os.environ.get("LOGIN_LOCKOUT_MINUTES", "15")) / 60  # minutes; axes reads a number as hours
AXES_LOCKOUT_PARAMETERS = {
    "username_ip": [["username", "ip_address"]],
    "username": ["username"],
    "ip": ["ip_address"],
}.get(os.environ.get("LOGIN_LOCKOUT_BY", "username_ip"))
if AXES_LOCKOUT_PARAMETERS is None:
    raise ImproperlyConfigured('LOGIN_LOCKOUT_BY must be "username_ip", "username" or "ip"')
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "tenants.lockout.lockout_response"
AXES_ENABLE_ADMIN = False  # counters live in the cache; lockouts are in the audit log
AXES_VERBOSE = False
# An invitation token (tenants.models.Invitation) is valid this long.
INVITATION_TTL_SECONDS = int(os.environ.get("INVITATION_TTL_SECONDS", str(7 * 24 * 3600)))

# --- Single sign-on with OpenID Connect (tenants/oidc; docs/operations-security.md, "Single sign-on (OIDC)") ---
# Off unless OIDC_ENABLED=1: then the chat app's and the console's login pages offer "Sign in with
# <OIDC_PROVIDER_NAME>" (the authorization code flow with state, nonce and PKCE; the client
# registered at the provider with the redirect URI <origin>/oidc/callback/, and the back-channel
# logout URI <origin>/oidc/backchannel-logout/ so that signing out there ends the sessions here), and
# the claim mapping rules decide each user's tenants and roles at every login. Local password logins stay.
# A wrong setting stops the start with a message naming it (tenants.oidc.provider.oidc_config_check).
OIDC_ENABLED = _env_bool("OIDC_ENABLED", False)
OIDC_PROVIDER_NAME = os.environ.get("OIDC_PROVIDER_NAME", "SSO")  # the button: "Sign in with <name>"
# The provider's issuer identifier (e.g. https://sso.example.com/realms/acme for Keycloak): every ID
# token's iss must be exactly this; the endpoints left empty below come from
# <OIDC_ISSUER>/.well-known/openid-configuration.
OIDC_ISSUER = os.environ.get("OIDC_ISSUER", "").strip()
OIDC_RP_CLIENT_ID = os.environ.get("OIDC_CLIENT_ID", "")  # the client id at the provider; every ID token's aud holds it
OIDC_RP_CLIENT_SECRET = _secret("OIDC_CLIENT_SECRET")  # the client's secret (environment, else the secrets file)
OIDC_RP_SCOPES = os.environ.get("OIDC_SCOPES", "openid email profile")  # add the scope that brings the rules' claims (groups)
OIDC_RP_SIGN_ALGO = os.environ.get("OIDC_SIGN_ALGO", "RS256")  # the ID tokens' algorithm: RS*/ES* (the provider's JWKS) or HS* (the secret)
# Endpoints: empty, from the discovery document (fetched once an hour per process).
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("OIDC_USERINFO_ENDPOINT", "")  # its claims are added to the ID token's
OIDC_OP_JWKS_ENDPOINT = os.environ.get("OIDC_JWKS_URI", "")
OIDC_TIMEOUT = float(os.environ.get("OIDC_TIMEOUT_SECONDS", "10"))  # each request to the provider (seconds)
# Signing out of the platform sends the browser here to sign out of the provider as well
# (RP-Initiated Logout; register <origin>/ as a post-logout redirect URI); empty: discovery's
# end_session_endpoint, and none there: the platform's session alone ends.
OIDC_OP_LOGOUT_ENDPOINT = os.environ.get("OIDC_END_SESSION_ENDPOINT", "")
# The claim mapping rules, a JSON list: [{"claim": "groups", "value": "acme-admins", "tenant": "acme",
# "role": "admin"}, …]; a claim equal to (or a list holding) the value gives the role in the tenant (by
# slug; the highest of the matching rules). In the tenants the rules name, memberships follow the rules
# at each login (no matching rule: the membership is removed); no rule matching: "no access".
OIDC_TENANT_RULES = os.environ.get("OIDC_TENANT_RULES", "")
# Fixed (mozilla-django-oidc's settings): PKCE (S256) and nonce on, TLS verified; of the tokens only
# the ID token is kept, in the server-side session, as the provider's logout hint (id_token_hint).
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_VERIFY_SSL = True
OIDC_STORE_ACCESS_TOKEN = False
OIDC_STORE_ID_TOKEN = True
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
# The backend acts only on the callback's login while OIDC_ENABLED (a no-op for password logins).
AUTHENTICATION_BACKENDS.append("tenants.oidc.backend.OidcBackend")

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
        "RunPurposeEnum": "sessions.models.RunPurpose",
        "ToolCallStatusEnum": "sessions.models.ToolCallStatus",
        "ExperimentStatusEnum": "evaluation.models.ExperimentStatus",
        "ExperimentResultStatusEnum": "evaluation.models.ResultStatus",
    },
    # Every /api/v1/ operation documents its {message, extra} error answers (agent_platform/api_schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "agent_platform.api_schema.add_error_responses",
    ],
}
# Open session event streams (WebSocket + SSE) one user may hold, across web processes
# (sessions/stream_guard.py); over it SSE answers 429 and a WebSocket is closed with 4429.
STREAMS_PER_USER_MAX = int(os.environ.get("STREAMS_PER_USER_MAX", "20"))

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
    # Long-term memory: extract idle sessions' new messages; delete memories past their retention.
    "memory-extract-due": {"task": "memory.extract_due",
                           "schedule": float(os.environ.get("MEMORY_EXTRACT_SCAN_SECONDS", "60"))},
    "memory-expire": {"task": "memory.expire", "schedule": 3600.0},
    "chats-purge": {"task": "sessions.chat_sessions_purge", "schedule": 3600.0},  # CHAT_PURGE_AFTER_DAYS
    # Schedules: fire due slots (exactly one run per slot, however many beats run; automations/services.py).
    "schedules-tick": {"task": "automations.schedules_tick", "schedule": 60.0},
    # OAuth: DOT's clear_expired, dead consents, unused registered clients (oauth_server/services.py).
    "oauth-cleanup": {"task": "oauth_server.cleanup", "schedule": 3600.0},
    # Outbound webhooks: retry the deliveries whose backoff is over (automations/outbound.py).
    "webhook-deliveries-due": {"task": "automations.deliveries_due", "schedule": 60.0},
    # Webhook rows past WEBHOOK_LOG_RETENTION_DAYS (automations/retention.py).
    "webhook-rows-purge": {"task": "automations.webhook_rows_purge", "schedule": 3600.0},
    # Model call records past their tenant's llm_body_retention_days (sessions/llm_bodies.py).
    "llm-bodies-purge": {"task": "sessions.llm_bodies_purge", "schedule": 3600.0},
}

# The worker's run host (sessions/runner/host.py): its event loop ("uvloop" or "asyncio") and
# the GIL switch interval in milliseconds (CPython's default is 5).
RUN_HOST_LOOP = os.environ.get("RUN_HOST_LOOP", "uvloop")
if RUN_HOST_LOOP not in {"uvloop", "asyncio"}:
    raise ImproperlyConfigured('RUN_HOST_LOOP must be "uvloop" or "asyncio"')
RUN_HOST_SWITCH_INTERVAL_MS = float(os.environ.get("RUN_HOST_SWITCH_INTERVAL_MS", "1"))


def _gc_thresholds(name: str, default: str, *, may_be_empty: bool) -> tuple[int, ...]:
    """``gc.set_threshold`` values from the environment variable ``name`` (``default`` if
    unset); empty (``may_be_empty``) means: leave the collector as CPython sets it."""
    raw = os.environ.get(name, default)
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
RUN_HOST_GC_THRESHOLDS = _gc_thresholds("RUN_HOST_GC_THRESHOLDS", "50000,20,100", may_be_empty=False)
# The web process's garbage-collector thresholds, set with gc.freeze() once the ASGI app is
# built (agent_platform/asgi.py); empty: CPython's defaults, nothing frozen. Smaller than the
# worker's: each message POST leaves ~200 objects in reference cycles (DRF's serializer fields,
# asgiref's locals), and at 50000,20,100 a young collection of ~60,000 of them stopped every
# stream of the web process for 166-579 ms, two or three times a round of 600 runs; at
# 2000,10,100 the longest of a round took 36-105 ms (bench/README.md, "Where a token's time
# goes, and the web process's young collections").
WEB_GC_THRESHOLDS = _gc_thresholds("WEB_GC_THRESHOLDS", "2000,10,100", may_be_empty=True)
# Runs a web process starts at once (sessions/api/agent_runs.py: run_start_gate): the chat app's
# POSTs that start a run (a message, regenerate, continue, edit, retry; agent_platform/asgi.py),
# the OpenAI-compatible API and A2A; more wait their turn. Each start is ORM and cache work in a
# thread of its own, holding the GIL the event loop needs to deliver streamed tokens: with 200
# clients starting at once on 2 cores, one at a time gave a token p95 of 38-43 ms, two 51-53 ms,
# no limit 115 ms, the wall time ~12 % longer; 600 messages posted at once, 34-38 ms against
# 139-176 ms with no limit (bench/README.md). 0: no limit. The agents' MCP server has its own 4 threads.
WEB_RUN_STARTS_MAX = int(os.environ.get("WEB_RUN_STARTS_MAX", "1"))
# Threads that run the runner's ORM calls in a worker process (sessions/runner/database.py: a run's
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
SUB_AGENT_MAX_DEPTH = int(os.environ.get("SUB_AGENT_MAX_DEPTH", "3"))
"""Deepest sub-run a sub-agent call (capability kind agent) may start; a user's run is depth 0."""
APPROVAL_TTL_SECONDS = float(os.environ.get("APPROVAL_TTL_SECONDS", str(24 * 3600)))
"""A pending approval or question expires after this (default 24 hours); the run then fails (approval_expired). An
MCP server's request for input (elicitation) that nobody answered in time is declined instead."""
MCP_ELICITATION_UNATTENDED_ANSWER = os.environ.get("MCP_ELICITATION_UNATTENDED_ANSWER", "decline")
"""The answer (decline or cancel) an MCP server's request for input gets at once in a run nobody
watches: one started through the OpenAI-compatible API, A2A or agents over MCP."""

# The chat app (issue 25): deleted chats are purged CHAT_PURGE_AFTER_DAYS after their deletion
# (0: never); a chat's first answer gets a title from the agent's route (CHAT_TITLES_FROM_MODEL);
# images up to CHAT_IMAGE_MAX_BYTES go to route entries that take images (default 3.75 MiB, whose
# base64 form is the Anthropic API's 5 MiB per-image limit).
CHAT_PURGE_AFTER_DAYS = int(os.environ.get("CHAT_PURGE_AFTER_DAYS", "30"))
# Outbound deliveries that ended (with their attempts) and inbound webhook requests are deleted
# this many days after they were made (0: kept forever; automations/retention.py).
WEBHOOK_LOG_RETENTION_DAYS = int(os.environ.get("WEBHOOK_LOG_RETENTION_DAYS", "30"))
CHAT_TITLES_FROM_MODEL = os.environ.get("CHAT_TITLES_FROM_MODEL", "1").lower() not in ("0", "false", "no", "off")
CHAT_IMAGE_MAX_BYTES = int(os.environ.get("CHAT_IMAGE_MAX_BYTES", str(5 * 1024 * 1024 * 3 // 4)))

# Model call records (issue 40): for a tenant with `record_llm_bodies`, the exact request and
# response bodies of its model calls are kept (sessions.LLMCallBody) for its own
# `llm_body_retention_days`; each body is cut at this many bytes of UTF-8 (the cut is marked).
LLM_BODY_MAX_BYTES = int(os.environ.get("LLM_BODY_MAX_BYTES", "1000000"))

# The embedded local model (scripts/llm_server.py) that the demo route points at.
LLM_BASE_URL = os.environ.get("LLM_BASE_URL", "http://127.0.0.1:8081/v1")
LLM_MODEL_NAME = os.environ.get("LLM_MODEL_NAME", "qwen2.5-coder-0.5b-instruct")
# The larger embedded model (Qwen2.5-Coder-1.5B-Instruct, a second scripts/llm_server.py) that the
# demo's "local-large" route tries first, falling back to LLM_BASE_URL's model: the Assistant's
# route, since the 0.5B invents a city's time instead of calling its tool for half the cities
# (docs/model-accuracy.md). Empty: no larger model; the Assistant uses the "local" route.
LLM_LARGE_BASE_URL = os.environ.get("LLM_LARGE_BASE_URL", "http://127.0.0.1:8083/v1")
LLM_LARGE_MODEL_NAME = os.environ.get("LLM_LARGE_MODEL_NAME", "qwen2.5-coder-1.5b-instruct")
# The embedded embedding model (all-MiniLM-L6-v2; scripts/llm_server.py with LLM_ROLE=embeddings)
# that each tenant's "Embedded embedder" provider points at (llm.embeddings).
EMBEDDINGS_BASE_URL = os.environ.get("EMBEDDINGS_BASE_URL", "http://127.0.0.1:8082/v1")

# Outbound connections made on a tenant's behalf (model providers: chat and route test; remote
# MCP servers: streamable HTTP, SSE) follow the web_fetch address rules (capabilities/netsafe.py:
# no loopback, private, link-local, CGNAT, metadata ... address), checked when the URL is saved
# and at every connect. Operators allow internal hosts here:
# OUTBOUND_ALLOWED_CIDRS  comma-separated networks allowed although not public (default none);
# OUTBOUND_ALLOWED_HOSTS  comma-separated host:port reached whatever they resolve to (default:
#                         LLM_BASE_URL's, LLM_LARGE_BASE_URL's and EMBEDDINGS_BASE_URL's
#                         host:port, so the demo routes and the embedded embedder reach the
#                         embedded models).
# Cloud metadata addresses stay blocked always. An invalid network fails at startup.
OUTBOUND_ALLOWED_CIDRS: list[str] = [
    str(ipaddress.ip_network(c.strip(), strict=False))
    for c in os.environ.get("OUTBOUND_ALLOWED_CIDRS", "").split(",") if c.strip()
]


def _default_outbound_hosts() -> str:
    from urllib.parse import urlsplit

    hosts: list[str] = []
    for url in (LLM_BASE_URL, LLM_LARGE_BASE_URL, EMBEDDINGS_BASE_URL):
        parts = urlsplit(url)
        if not parts.hostname:
            continue
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        if f"{host}:{port}" not in hosts:
            hosts.append(f"{host}:{port}")
    return ",".join(hosts)


OUTBOUND_ALLOWED_HOSTS: list[str] = [
    h.strip().lower() for h in os.environ.get("OUTBOUND_ALLOWED_HOSTS", _default_outbound_hosts()).split(",")
    if h.strip()
]

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
# The most one MCP resource attached to a message may hold when read (capabilities/mcp/attached.py), bytes.
MCP_RESOURCE_MAX_BYTES = int(os.environ.get("MCP_RESOURCE_MAX_BYTES", str(4 * 1024 * 1024)))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # LOG_LEVEL: the root logger's level (DEBUG, INFO, WARNING, ERROR).
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"httpx": {"level": "WARNING"}, "httpx2": {"level": "WARNING"}, "mcp": {"level": "WARNING"},
                "axes": {"level": "WARNING"}},  # every login's INFO lines; failures and lockouts are audit events
}

# CLI capabilities: the bubblewrap executable (a name on PATH or a path). Missing: sandboxed
# CLI commands refuse to run (docs/admin-guide.md, "CLI commands").
CLI_BWRAP_PATH = os.environ.get("CLI_BWRAP_PATH", "bwrap")

# --- Confinement of every program a run starts (capabilities/confinement.py; docs/operations-security.md)
# The host uid/gid confined programs run as when the worker is root (65534: nobody/nogroup).
SANDBOX_UID = int(os.environ.get("SANDBOX_UID", "65534"))
SANDBOX_GID = int(os.environ.get("SANDBOX_GID", "65534"))
# The Python of programs that are Python modules (templates say ${PYTHON}): a virtualenv made by
# scripts/bootstrap.sh from the system's /usr/bin/python3, so that the unprivileged sandbox user
# can read all of it; and the host paths every sandbox sees read-only besides /usr. Where it lives
# is agent_platform/sandbox_paths.py's answer (the bootstrap's too): machine-wide under
# /var/lib/agent-platform/sandbox/ for root (a checkout in a 0700 directory stays closed to the
# sandbox user), else in the checkout's var/sandbox/.
_SANDBOX_VENV = sandbox_venv(BASE_DIR)
SANDBOX_PYTHON = os.environ.get("SANDBOX_PYTHON", str(_SANDBOX_VENV / "bin" / "python"))
SANDBOX_RO_BINDS = [
    p.strip() for p in os.environ.get("SANDBOX_RO_BINDS", str(_SANDBOX_VENV)).split(",")
    if p.strip()
]
# The operator's maximum resource limits of each process of a confined program (prlimit;
# capabilities/confinement.py, SandboxLimits): a template's `limits` may only lower them.
# Environment: "name=value,...", e.g. SANDBOX_LIMITS="cpu_seconds=120,memory_mb=1024"; a name not
# given keeps its default. processes counts every task of SANDBOX_UID on the host
# (docs/operations-security.md, "The sandbox").
SANDBOX_LIMITS: dict[str, int] = {
    "cpu_seconds": 300, "memory_mb": 2048, "processes": 256, "file_size_mb": 256, "open_files": 1024,
}
for _item in filter(None, (i.strip() for i in os.environ.get("SANDBOX_LIMITS", "").split(","))):
    _name, _, _value = _item.partition("=")
    if _name.strip() not in SANDBOX_LIMITS or not _value.strip().isdigit() or int(_value) < 1:
        raise ImproperlyConfigured(
            f"SANDBOX_LIMITS: {_item!r} is not name=positive integer with a name of {', '.join(SANDBOX_LIMITS)}")
    SANDBOX_LIMITS[_name.strip()] = int(_value)
# Persistent data directories of catalogue programs that declare one (capabilities/data_dirs.py):
# for root beside the embedded PostgreSQL (/var/lib/agent-platform/sandbox-data, backed up with
# the machine directory), else the checkout's var/sandbox-data.
_DATA_HOME = machine_sandbox_root().parent if os.geteuid() == 0 else BASE_DIR / "var"
SANDBOX_DATA_ROOT = os.environ.get("SANDBOX_DATA_ROOT") or str(_DATA_HOME / "sandbox-data")
# The Python (inside the sandbox: under /usr or a read-only bind) that runs the egress bridge.
SANDBOX_BRIDGE_PYTHON = os.environ.get("SANDBOX_BRIDGE_PYTHON", "/usr/bin/python3")
# Networks a sandbox's egress proxy lets through although they are not public (an operator's
# decision, e.g. an intranet); empty by default. Metadata addresses stay blocked.
SANDBOX_EGRESS_ALLOWED_CIDRS: list[str] = [
    str(ipaddress.ip_network(c.strip(), strict=False))
    for c in os.environ.get("SANDBOX_EGRESS_ALLOWED_CIDRS", "").split(",") if c.strip()
]
# How long the console's "Test connection" waits for the worker that runs the test (seconds).
MCP_TEST_CONNECTION_WAIT_SECONDS = float(os.environ.get("MCP_TEST_CONNECTION_WAIT_SECONDS", "90"))
# How long the chat app's MCP prompts (the / commands: list, get, complete) wait for the worker
# that asks the server (seconds).
MCP_PROMPTS_WAIT_SECONDS = float(os.environ.get("MCP_PROMPTS_WAIT_SECONDS", "20"))

# --- Browser capability (browser/) -------------------------------------------------------------
# Chrome extension ids allowed to open /ws/browser/ (Origin chrome-extension://<id>). The default
# is the id fixed by the "key" in chrome_extension/manifest.json.
BROWSER_EXTENSION_IDS = [
    i.strip() for i in os.environ.get("BROWSER_EXTENSION_IDS", "mbcfbjmfgndlpbhnffdhmbecjdjpeeok").split(",") if i.strip()
]
BROWSER_PAIRING_TTL_SECONDS = 600
# Pairing limits (browser/api/views.py; docs/operations-security.md, "Abuse controls"). None of them lets one client
# lock out the others behind its address for long:
BROWSER_PAIRING_RATE_LIMIT = 20  # new pairings per client IP per minute (a flood blocks that IP ≤ 1 min)
BROWSER_PAIRING_POLL_RATE_LIMIT = 600  # token polls per pairing (per its poll secret) per 10 minutes (the extension polls every 2 s)
BROWSER_PAIRING_POLL_FAILURE_LIMIT = 60  # failed polls (unknown pairing, wrong secret) per client IP per 10 minutes
BROWSER_PAIRING_APPROVE_RATE_LIMIT = 20  # wrong codes per user per 10 minutes
# The Chromium the server browser starts (Playwright with this executable; never a downloaded one).
BROWSER_CHROMIUM_PATH = os.environ.get("BROWSER_CHROMIUM_PATH", "/usr/lib/chromium/chromium")
# The host uid/gid the server browser's Chromium runs as when the worker is root: not
# SANDBOX_UID, so that Chromium's many processes and threads do not count against the process
# limit of confined programs (RLIMIT_NPROC is per uid, host-wide) and neither can signal the other.
BROWSER_SERVER_UID = int(os.environ.get("BROWSER_SERVER_UID", "65533"))
BROWSER_SERVER_GID = int(os.environ.get("BROWSER_SERVER_GID", "65533"))
BROWSER_SERVER_IDLE_SECONDS = int(os.environ.get("BROWSER_SERVER_IDLE_SECONDS", "600"))
BROWSER_SERVER_HEADLESS = True


# --- OAuth 2.1 for MCP clients (oauth_server; docs/operations-security.md, "OAuth for MCP clients") ---
# OAUTH_ISSUER: the public origin (https://agents.example.com, no path) that names this
# authorization server and its MCP resources in metadata and tokens. Empty: the origin each
# request reached (fine on one host name; set it behind a proxy or with several names).
OAUTH_ISSUER = os.environ.get("OAUTH_ISSUER", "").rstrip("/")
OAUTH_ACCESS_TOKEN_SECONDS = int(os.environ.get("OAUTH_ACCESS_TOKEN_SECONDS", "3600"))  # an access token's life
# a refresh token's life (each refresh replaces it: the used one is revoked)
OAUTH_REFRESH_TOKEN_SECONDS = int(os.environ.get("OAUTH_REFRESH_TOKEN_SECONDS", str(30 * 24 * 3600)))
# DOT's own models (named here: Django's migrations read these swappable settings).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL = "oauth2_provider.AccessToken"
OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL = "oauth2_provider.RefreshToken"
OAUTH2_PROVIDER_GRANT_MODEL = "oauth2_provider.Grant"
OAUTH2_PROVIDER_ID_TOKEN_MODEL = "oauth2_provider.IDToken"
# A dynamically registered OAuth client with no token after this many days is deleted (oauth-cleanup).
OAUTH_UNUSED_CLIENT_DAYS = int(os.environ.get("OAUTH_UNUSED_CLIENT_DAYS", "30"))
OAUTH2_PROVIDER = {
    "OAUTH2_VALIDATOR_CLASS": "oauth_server.validator.McpOAuth2Validator",
    "SCOPES": {"mcp": "Use the MCP server as you: list and call its tools in the tenant you choose"},
    "DEFAULT_SCOPES": ["mcp"],
    "OIDC_ISS_ENDPOINT": OAUTH_ISSUER,
    "PKCE_REQUIRED": True,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ACCESS_TOKEN_EXPIRE_SECONDS": OAUTH_ACCESS_TOKEN_SECONDS,
    "REFRESH_TOKEN_EXPIRE_SECONDS": OAUTH_REFRESH_TOKEN_SECONDS,
    "ROTATE_REFRESH_TOKEN": True,  # every refresh issues a new refresh token; the used one is revoked
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": 0,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,  # a revoked refresh token presented again revokes its family
    "REQUEST_APPROVAL_PROMPT": "force",  # the consent page every time (it is where the tenant is chosen)
    # Redirect URIs: https anywhere, http to loopback only, private-use schemes of native apps,
    # never javascript:/data:/file:/… or a fragment (oauth_server/redirects.py, one rule for
    # registration, metadata documents and the authorization request). This list is only DOT's
    # fallback when no client is known; a client's allowed schemes come from its own URIs.
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http", "https"],
    "ALLOW_LOCALHOST_LOOPBACK": True,  # http://localhost:<any port>, like 127.0.0.1 (RFC 8252 §7.3)
    # RFC 9700 (OAuth security BCP): enforced, not only warned about.
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,  # S256 only
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,  # RFC 9207 `iss` on the redirect
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,  # tokens stored as SHA-256 checksums only
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_basic", "client_secret_post"],
    "DCR_ENABLED": True,  # RFC 7591, open (MCP clients register themselves), rate-limited per address
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "CIMD_ENABLED": True,  # a client_id that is an https URL: its metadata document, fetched address-checked
    "CIMD_METADATA_FETCHER": "oauth_server.cimd.NetsafeMetadataFetcher",
}

# Observability (docs/observability.md): traces are on when OTEL_EXPORTER_OTLP_ENDPOINT is set.
METRICS_BEARER_TOKEN = os.environ.get("METRICS_BEARER_TOKEN", "")
"""The bearer token GET /metrics (Prometheus) asks for; empty: /metrics answers 404."""
# With traces on: also a span per SQL statement (psycopg) and per Redis command (redis), about
# seven per turn of a run, which cost a turn ~20 % more CPU (bench/README.md, "Tracing cost");
# off: the platform's GenAI spans and the HTTP, Celery task and httpx spans only.
TRACING_STATEMENT_SPANS = _env_bool("TRACING_STATEMENT_SPANS", False)
