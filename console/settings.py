"""Console settings, read from the environment.

Defaults run embedded on one machine (SQLite, a file-system Celery broker, the in-memory channel layer).
CONSOLE_MODE=production demands a secret key, allowed hosts and a real database, and turns on HTTPS settings.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from console.env import (
    check_url_scheme,
    env_bool,
    env_fernet_keys,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_str,
)
from workers import protocol as _protocol

BASE_DIR = Path(__file__).resolve().parent.parent
# templates/ and static/ sit beside the code in a checkout; a non-editable install puts them under share/.
SHARE_DIR = BASE_DIR if (BASE_DIR / "templates").is_dir() else Path(sys.prefix) / "share" / "gpu-console"
VAR_DIR = Path(env_str("CONSOLE_VAR_DIR", str(BASE_DIR / "var")))

CONSOLE_MODE = env_str("CONSOLE_MODE", "dev")
if CONSOLE_MODE not in {"dev", "production"}:
    raise ImproperlyConfigured(f"Environment variable CONSOLE_MODE={CONSOLE_MODE!r} must be 'dev' or 'production'.")
PRODUCTION = CONSOLE_MODE == "production"

DEBUG = env_bool("DJANGO_DEBUG", not PRODUCTION)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("Environment variable DJANGO_DEBUG must be off in production mode.")

SECRET_KEY = env_str("DJANGO_SECRET_KEY", None, required=PRODUCTION) or "dev-only-insecure-key-change-me"
if PRODUCTION and len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("Environment variable DJANGO_SECRET_KEY must be at least 50 characters long.")
# The keys shipped in deploy/'s examples say "change-me": anyone who read them could forge sessions and CSRF tokens.
if PRODUCTION and ("change-me" in SECRET_KEY.lower() or SECRET_KEY.startswith("django-insecure-")
                   or len(set(SECRET_KEY)) < 5):
    raise ImproperlyConfigured(
        "Environment variable DJANGO_SECRET_KEY is an example or placeholder key (deploy/'s examples are public): "
        "generate one, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(50))'.")

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]", "testserver"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("Environment variable DJANGO_ALLOWED_HOSTS must list the console's host names.")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "apps.core.apps.ConsoleAdminConfig",  # django.contrib.admin, its changes audited
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "apps.core",
    "apps.accounts",
    "apps.quotas",
    "apps.cluster",
    "apps.jobs",
    "apps.telemetry",
    "apps.serving",
    "apps.operations",
    "apps.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Above the middleware that answer an exception themselves: it sees only what they leave.
    "apps.core.error_pages.ErrorPagesMiddleware",
    "apps.core.middleware.DatabaseUnavailableMiddleware",
    "apps.dashboard.errors.DomainErrorMiddleware",
    # Last: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [SHARE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.dashboard.context.nav",
            ],
        },
    },
]

# --- database
DATABASE_URL = env_str("DATABASE_URL", None, required=PRODUCTION)
if DATABASE_URL:
    check_url_scheme("DATABASE_URL", DATABASE_URL, ("postgres", "postgresql", "sqlite"))
    try:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    except ValueError as exc:
        raise ImproperlyConfigured(f"Environment variable DATABASE_URL is not a valid database URL: {exc}") from None
    if DATABASES["default"]["ENGINE"].endswith("postgresql") and env_bool("CONSOLE_DB_POOL", True):
        # Under ASGI every request runs in a fresh thread context, so persistent connections are never reused:
        # without a pool each request opens a connection (and a burst exhausts PostgreSQL's max_connections).
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        # With a pool this checks each connection as it is taken out (one empty round trip): after a PostgreSQL
        # restart the pool's dead connections are dropped instead of failing a request each.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1, "max_size": env_int("CONSOLE_DB_POOL_SIZE", 8, minimum=1),
            # How long a request waits for a connection: while PostgreSQL is down it answers 503 after this,
            # sooner than an agent's 10 s HTTP timeout.
            "timeout": 4,
            # Give up a reconnection attempt after 10 s (the next request starts a fresh one) instead of backing
            # off for up to 5 minutes: the console is back within seconds of PostgreSQL.
            "reconnect_timeout": 10,
        }
else:
    VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The embedded state (database, broker, tokens, artifacts) is the console's and its agent's alone: jobs,
    # which run under other uids, must not read it (nor any other local user).
    if VAR_DIR.stat().st_uid == os.geteuid():
        VAR_DIR.chmod(0o700)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "db.sqlite3",
            # Several processes (ASGI server, Celery, agent ingest) write to the embedded database:
            # WAL lets readers run beside the writer, IMMEDIATE takes the write lock up front so
            # row-locked sections serialise instead of failing on lock upgrades.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3") and PRODUCTION:
    raise ImproperlyConfigured("Environment variable DATABASE_URL must point to PostgreSQL in production mode.")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, Celery, channels
REDIS_URL = env_str("REDIS_URL", None)
if REDIS_URL:
    check_url_scheme("REDIS_URL", REDIS_URL, ("redis", "rediss", "unix"))

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", None) or "filesystem://"
check_url_scheme("CELERY_BROKER_URL", CELERY_BROKER_URL, ("filesystem", "redis", "rediss", "amqp", "amqps", "memory"))
BROKER_DIR = VAR_DIR / "broker"
if CELERY_BROKER_URL.startswith("filesystem"):
    BROKER_DIR.mkdir(parents=True, exist_ok=True)
    # kombu's filesystem channel with atomic writes and claims (see workers/broker.py).
    CELERY_BROKER_TRANSPORT = "workers.broker:FilesystemTransport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR),
        "data_folder_out": str(BROKER_DIR),
        "processed_folder": str(VAR_DIR / "broker-processed"),
        "control_folder": str(VAR_DIR / "broker-control"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
# One task per pool process at a time on a real broker. On the embedded (filesystem) broker Celery's worker runs
# its blocking loop, which acknowledges a finished task only when its 2-second wait for the next message ends: with
# one message in flight per process the worker took one task every 2 s, fewer than beat sends (measured: 873
# messages waiting in a test cluster). Sixteen in flight per process keep up with beat and submissions.
CELERY_WORKER_PREFETCH_MULTIPLIER = 16 if CELERY_BROKER_URL.startswith("filesystem") else 1
CELERY_TASK_DEFAULT_QUEUE = "console"
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
SCHEDULER_PASS_INTERVAL_S = env_int("CONSOLE_SCHEDULER_INTERVAL_S", 5, minimum=1)
REAPER_INTERVAL_S = env_int("CONSOLE_REAPER_INTERVAL_S", 10, minimum=1)
# A host whose last heartbeat is older than this is marked down (its jobs requeued or failed, its alert fired), and
# its GPUs show as stale in the live frames and pages. Agents send one every 5 s
# (workers.protocol.HEARTBEAT_INTERVAL_S), so it is at least 10.
HEARTBEAT_TIMEOUT_S = env_int("CONSOLE_HEARTBEAT_TIMEOUT_S", int(_protocol.HEARTBEAT_TIMEOUT_S),
                              minimum=int(2 * _protocol.HEARTBEAT_INTERVAL_S))
# Idle release (an alert rule of kind job_idle with the action release_job): the owner is warned when the rule
# fires; if the job's GPUs are still idle this many seconds later, it is checkpointed, then released (cancelled).
IDLE_RELEASE_GRACE_S = env_int("CONSOLE_IDLE_RELEASE_GRACE_S", 600, minimum=0)
# A job placed this long ago whose process never started has lost its dispatch message (say, the broker
# restarted without persistence): it is sent again. The agent ignores a copy of a job it already runs.
JOBS_REDISPATCH_AFTER_S = env_int("CONSOLE_REDISPATCH_AFTER_S", 60, minimum=5)
SERVING_RECONCILE_S = env_int("CONSOLE_SERVING_RECONCILE_S", 3, minimum=1)
# A service scales down only when this long has passed since its last change (the autoscaler's stabilization window,
# apps.scheduling.autoscale.ScalingRules.down_stabilization_s).
SERVING_SCALE_DOWN_AFTER_S = env_int("CONSOLE_SERVING_SCALE_DOWN_AFTER_S", 60, minimum=1)
TELEMETRY_KEEP_10S_HOURS = env_int("CONSOLE_TELEMETRY_KEEP_10S_HOURS", 24, minimum=1)
TELEMETRY_KEEP_1M_DAYS = env_int("CONSOLE_TELEMETRY_KEEP_1M_DAYS", 31, minimum=1)
# How often the cluster's snapshot (GPU counts, team allocation, queue and waits) is written; 10 s matches the
# finest history buckets.
TELEMETRY_SNAPSHOT_S = env_int("CONSOLE_TELEMETRY_SNAPSHOT_S", 10, minimum=1)
# Optional cost per GPU-hour by GPU type for the usage report, e.g. "H200=4.5,A100=2.1".
CONSOLE_GPU_HOUR_COST = env_str("CONSOLE_GPU_HOUR_COST", "") or ""
# A bare row-locked insert endpoint for benchmarks/submit_load.py (never in production).
BENCHMARK_ENDPOINTS = env_bool("CONSOLE_BENCHMARK_ENDPOINTS", False) and not PRODUCTION
# Bearer token Prometheus presents at /metrics (admins' sessions and API tokens work too).
METRICS_TOKEN = env_str("CONSOLE_METRICS_TOKEN", None)
# The scheduling policy (apps.scheduling.config.PolicyConfig): "console" (priorities with preemption, quota
# guarantees with borrowing, fair share, shortest predicted remaining time with aging, gang placement), or
# "fifo", "fifo-backfill", "fair-share".
SCHEDULER = {
    "policy": env_str("CONSOLE_SCHEDULER_POLICY", "console"),
    "min_run_before_preempt_s": float(env_int("CONSOLE_MIN_RUN_BEFORE_PREEMPT_S", 600, minimum=0)),
    # ... and at most this fraction of the median run time of the finished jobs (0: the fixed minimum only)
    "min_run_median_fraction": env_float("CONSOLE_MIN_RUN_MEDIAN_FRACTION", 0.2, minimum=0.0),
    "max_preemptions_per_job": env_int("CONSOLE_MAX_PREEMPTIONS_PER_JOB", 3, minimum=0),
    # Aging (a waiting job's score over 1 + waited / aging time): ten days, or this many times the 90th
    # percentile of the cluster's run times if that is shorter, never under an hour (0: ten days)
    "aging_long_run_multiple": env_float("CONSOLE_AGING_LONG_RUN_MULTIPLE", 4.5, minimum=0.0),
    # ... this many times slower for a job that declares its steps (ordered by its whole declared size)
    "declared_aging_multiple": env_float("CONSOLE_DECLARED_AGING_MULTIPLE", 6.0, above=0.0),
    # A gang that declares its steps may stop running jobs this many times narrower that declare theirs once their
    # declared size is any larger (not 1.5x): PolicyConfig.gang_preempt_width (0: off)
    "gang_preempt_width": env_float("CONSOLE_GANG_PREEMPT_WIDTH", 4.0, minimum=0.0),
    "borrowing": env_bool("CONSOLE_SCHEDULER_BORROWING", True),
    "backfill": env_bool("CONSOLE_SCHEDULER_BACKFILL", False),
    # A gang that the free GPUs hold in number but not on the fewest hosts moves up to this many running jobs
    # elsewhere (apps/scheduling/defrag.py; CONSOLE_SCHEDULER_DEFRAGMENT=0 turns it off)
    "defragment": env_bool("CONSOLE_SCHEDULER_DEFRAGMENT", True),
    "max_defrag_moves": env_int("CONSOLE_SCHEDULER_MAX_DEFRAG_MOVES", 4, minimum=0),
}
# Measured-utilization packing of shareable jobs (apps.scheduling.colocation.ColocationConfig; docs/architecture.md
# "Sharing GPUs"): a pass every scheduler interval, when enabled.
COLOCATION_ENABLED = env_bool("CONSOLE_COLOCATION", True)  # CONSOLE_COLOCATION=0 turns the packing pass off
# Teams whose one-GPU training jobs are shareable unless they say otherwise ("shareable": false).
COLOCATION_SHAREABLE_TEAMS = env_list("CONSOLE_SHAREABLE_TEAMS", [])
COLOCATION = {
    "max_utilization_pct": env_float("CONSOLE_COLOCATION_MAX_UTILIZATION_PCT", 30.0, above=0.0),
    "min_samples": env_int("CONSOLE_COLOCATION_MIN_SAMPLES", 15, minimum=1),
    "max_slowdown": env_float("CONSOLE_COLOCATION_MAX_SLOWDOWN", 1.5, above=1.0),
}
if SCHEDULER["policy"] not in {"console", "fifo", "fifo-backfill", "fair-share"}:
    raise ImproperlyConfigured(
        f"Environment variable CONSOLE_SCHEDULER_POLICY={SCHEDULER['policy']!r} must be one of console, fifo, "
        "fifo-backfill, fair-share."
    )

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "apps.telemetry.channel_layer.RedisChannelLayer",  # cancels always end (its docstring)
            # redis-py caps an async pool at 100 connections by default: raise it for many websockets.
            # socket_timeout above channels-redis' 5 s blocking receive: redis-py 8 otherwise times the read
            # out first and the consumer dies (measured by benchmarks/telemetry.py).
            "CONFIG": {"hosts": [{"address": REDIS_URL, "max_connections": 1000, "socket_timeout": 30}]},
        }
    }
    # django-redis so that a Redis outage degrades instead of failing requests: everything the console caches
    # (latest telemetry frames, websocket tickets, alert timers, scheduler-pass debouncing) can be lost; the
    # database holds the truth. Ignored errors are logged (DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS).
    CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL,
                          "OPTIONS": {"IGNORE_EXCEPTIONS": True, "SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5}}}
    DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # A cache the ASGI server and the Celery worker share (latest telemetry, service replicas) without a server.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                          "LOCATION": str(VAR_DIR / "cache"), "OPTIONS": {"MAX_ENTRIES": 20000}}}

# --- auth
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    # django-axes first: it refuses logins from a username + address that failed too often.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("CONSOLE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_int("CONSOLE_LOGIN_COOLOFF_MINUTES", 15, minimum=1) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_VERBOSE = False
AXES_LOCKOUT_CALLABLE = "apps.accounts.lockout.lockout_response"
# The lockout counts failures per client address, as the audit log records it: one function derives it.
AXES_CLIENT_IP_CALLABLE = "apps.core.client_address.client_ip"
# Reverse proxies whose X-Forwarded-For is believed (IPs or CIDRs); empty: the peer's address is the client's, and
# X-Forwarded-For is ignored (anyone can send it). The ASGI server runs with --no-proxy-headers for the same reason.
TRUSTED_PROXIES = env_networks("CONSOLE_TRUSTED_PROXIES")
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# The longest lifetime of an API token, whoever creates it (API, dashboard): the serializers, the form and
# token_create all read this one value.
API_TOKEN_MAX_DAYS = 366
API_TOKEN_DEFAULT_DAYS = env_int("CONSOLE_API_TOKEN_DAYS", 90, minimum=1)
if API_TOKEN_DEFAULT_DAYS > API_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured(
        f"Environment variable CONSOLE_API_TOKEN_DAYS={API_TOKEN_DEFAULT_DAYS} must be at most {API_TOKEN_MAX_DAYS}.")

# Team secrets (apps/accounts/secrets.py) are encrypted at rest with Fernet keys: a comma-separated list, the first
# encrypts, every one decrypts (rotate by putting a new key first, then re-encrypting: manage.py reencrypt_secrets).
# Development derives one from DJANGO_SECRET_KEY so `make run` works; production demands its own.
CONSOLE_SECRETS_KEYS = env_fernet_keys("CONSOLE_SECRETS_KEY", SECRET_KEY, required=PRODUCTION)
if PRODUCTION and any(b"change-me" in base64.urlsafe_b64decode(key) for key in CONSOLE_SECRETS_KEYS):
    raise ImproperlyConfigured("Environment variable CONSOLE_SECRETS_KEY holds deploy/'s example key: generate one.")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's JSON parser with a nesting cap (a deeply nested body is a 400, never a RecursionError).
    "DEFAULT_PARSER_CLASSES": [
        "apps.core.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "apps.core.api.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.core.api.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + ([] if PRODUCTION else ["rest_framework.renderers.BrowsableAPIRenderer"]),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU cluster console API",
    "DESCRIPTION": "Submit and follow GPU jobs, manage teams, quotas and hosts.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI's files from drf-spectacular-sidecar, served as the console's static files (no CDN at run time).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "PREPROCESSING_HOOKS": ["apps.core.schema.drop_slashed_twins"],
    # Every operation's error answers (400/401/403/404/503) besides the success one drf-spectacular documents.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.core.schema.add_error_responses",
    ],
    # What Django's path converters accept (any other value is no URL of the API).
    "PATH_CONVERTER_OVERRIDES": {"slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
                                 "int": {"type": "integer", "minimum": 0}},
    "ENUM_NAME_OVERRIDES": {
        "PriorityEnum": "apps.quotas.models.Priority",
        "JobKindEnum": "apps.jobs.models.Job.Kind",
        "JobStateEnum": "apps.jobs.models.Job.State",
        "AlertRuleKindEnum": "apps.telemetry.models.AlertRule.Kind",
    },
}

# --- jobs
JOBS_DEFAULT_TIME_LIMIT_MINUTES = env_int("CONSOLE_DEFAULT_TIME_LIMIT_MINUTES", 240, minimum=1)
JOBS_MAX_TIME_LIMIT_MINUTES = env_int("CONSOLE_MAX_TIME_LIMIT_MINUTES", 7 * 24 * 60, minimum=1)
# Submissions per user per minute (checked under the team's quota lock, so it holds under concurrency).
JOBS_SUBMIT_PER_MINUTE = env_int("CONSOLE_SUBMIT_PER_MINUTE", 600, minimum=1)
JOBS_LOG_MAX_CHARS = env_int("CONSOLE_JOB_LOG_MAX_CHARS", 10_000_000, minimum=1000)
# Points kept per metric series of a job (apps/jobs/metrics.py thins a longer series evenly).
JOBS_METRIC_POINTS = env_int("CONSOLE_JOB_METRIC_POINTS", 2000, minimum=10)
# The largest file a running job may store through the job API (PUT /api/v1/job/artifacts/...).
JOB_ARTIFACT_MAX_BYTES = env_int("CONSOLE_JOB_ARTIFACT_MAX_MB", 4096, minimum=1) * 1024 * 1024
# A job's CPUs and memory (its cgroup's limits on the host) when its spec names none: per GPU it asks for.
JOBS_CPUS_PER_GPU = env_float("CONSOLE_JOB_CPUS_PER_GPU", 4.0, above=0)
JOBS_MEMORY_GB_PER_GPU = env_float("CONSOLE_JOB_MEMORY_GB_PER_GPU", 32.0, above=0)
# Where checkpoints, logs and outputs live: a directory every host reaches, or s3://bucket/prefix.
ARTIFACT_STORE_URL = env_str("CONSOLE_ARTIFACTS", None) or (VAR_DIR / "artifacts").as_uri()

# --- i18n, static
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [SHARE_DIR / "static"]
WHITENOISE_USE_FINDERS = not PRODUCTION
if not PRODUCTION:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# --- security
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("CONSOLE_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
