"""Tollgate settings, read from the environment (django-environ).

Embedded default (nothing set): SQLite file ``db.sqlite3``, Dramatiq's
StubBroker with an in-process worker, Channels' in-memory layer.
Production shape: set ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL``
(Dramatiq broker and channel layer).
"""

import os
import warnings
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from runs.base.log_context import FORMATS, logging_settings

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# Off unless the environment says otherwise: the debug page shows settings
# and local variables to whoever triggers an error.
DEBUG = env.bool("DEBUG", default=False)
# The public key below signs sessions only where DEBUG is on (a developer's
# machine); with DEBUG off the public key refuses to start anything. A missing
# key is left empty: commands that sign nothing (migrate, demo) still run,
# Django refuses to sign with an empty key, and `serve` and the ASGI
# application refuse to start without one (config.secret_key).
DEVELOPMENT_SECRET_KEY = "tollgate-insecure-development-key"
# Read as it is: django-environ would take a key starting with "$" for a
# reference to another variable (Django's own key generator may start one so).
SECRET_KEY = os.environ.get("SECRET_KEY", "") or (DEVELOPMENT_SECRET_KEY if DEBUG else "")
if not DEBUG and SECRET_KEY == DEVELOPMENT_SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is the public development key, which only DEBUG may use; "
        "set a long random string (see README)."
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    # First, so that its runserver wins: ``manage.py runserver`` is ``manage.py serve`` (config.runserver).
    # Not "daphne": its app imports Daphne's server (Twisted, OpenSSL: 23 MiB of a worker's RSS) into every
    # process, workers included, for the sake of its runserver; serve runs Daphne's server itself.
    "config.runserver",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "channels",
    "django_dramatiq",
    "csp",
    "axes",
    "runs",
    "tools",
    "approvals",
    # The demo shop, a plug-in: TOLLGATE_DEMO=false leaves it out and the product runs without it.
    *(["tools.demo"] if env.bool("TOLLGATE_DEMO", default=True) else []),
    "runs.webhooks",
    # Health and readiness probes, worker heartbeats, /metrics (docs/operating.md).
    "runs.ops",
    # An integrator's own apps (their tools, completion checks, providers),
    # by dotted path, comma-separated: no settings module of their own needed.
    *env.list("TOLLGATE_EXTRA_APPS", default=[]),
]

MIDDLEWARE = [
    # First: /healthz, /readyz and /metrics are answered before host checks,
    # HTTPS redirects, sessions and rate limits (runs.ops.middleware).
    "runs.ops.middleware.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A body framed by Transfer-Encoding (chunked) would be read as empty: 411.
    "config.middleware.LengthRequiredMiddleware",
    # Static files (WhiteNoise): only files it indexed at start-up are
    # served, so no request path is ever joined onto a directory.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # After sessions, before CommonMiddleware (Django's order): the page
    # language from the language cookie (the header's switcher), else the
    # browser's Accept-Language, else LANGUAGE_CODE.
    "django.middleware.locale.LocaleMiddleware",
    # The API always answers in English; pages in the time zone the
    # browser reports (config.middleware).
    "config.middleware.ApiInEnglishMiddleware",
    "config.middleware.BrowserTimeZoneMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into 429.
    "axes.middleware.AxesMiddleware",
]

# Login rate limiting (django-axes): after AXES_FAILURE_LIMIT failed logins
# from one address, whatever usernames they tried (password spraying), that
# address is locked out for AXES_COOLOFF_TIME hours (429). Only the address:
# someone elsewhere cannot lock a user out of their own logins. The address
# is the one the throttles count (config.throttles.client_address: behind
# TOLLGATE_TRUSTED_PROXIES, the client's, not the proxy's). A successful
# login does not wipe the address's failures (an attacker's own account
# would reset the count); they age out after AXES_COOLOFF_TIME. Token and
# session requests are not counted.
# Then Django's ModelBackend, as runs.permissions.PermissionsBackend: the same logins and the same
# permissions, a user's own and their groups' read in one statement instead of two. A session is
# tied to the backend that logged it in (its dotted path): renaming it logs the users out once.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "runs.permissions.PermissionsBackend",
]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("AXES_COOLOFF_TIME", default=0.25)
AXES_LOCKOUT_PARAMETERS = ["ip_address"]
AXES_CLIENT_IP_CALLABLE = "config.throttles.client_address"
AXES_RESET_ON_SUCCESS = False

# --- HTTPS and browser security (production sets these; see README) -------
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
# e.g. "HTTP_X_FORWARDED_PROTO,https" behind a TLS-terminating proxy that
# always sets (and never passes on) that header.
_proxy_ssl_header = env.list("SECURE_PROXY_SSL_HEADER", default=[])
SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header) if _proxy_ssl_header else None
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy (django-csp): scripts, styles and everything else
# from this site only; no inline script or style, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.template.context_processors.tz",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "approvals.web.context.inbox_counts",
            ],
        },
    },
]

ASGI_APPLICATION = "config.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The in-process worker writes from another thread: wait for the lock
    # instead of failing, and keep the test database in a file that every
    # thread (and a server subprocess, through the inherited environment)
    # can open; one file per test process, so parallel runs do not collide.
    # IMMEDIATE transactions take the write lock up front, so concurrent
    # writers queue for up to ``timeout`` seconds instead of failing at
    # once with "database is locked"; WAL lets readers go on meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=30, transaction_mode="IMMEDIATE", init_command="PRAGMA journal_mode=WAL;"
    )
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.setdefault("TOLLGATE_SQLITE_TEST_DB", f"/tmp/tollgate-test-{os.getpid()}.sqlite3")
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, but a group commit's job releases its nested savepoints with its own (runs.base.postgresql).
    DATABASES["default"]["ENGINE"] = "runs.base.postgresql"
    # Each process keeps its connections in a psycopg pool (Django's
    # ``OPTIONS["pool"]``): a fresh PostgreSQL backend costs milliseconds of
    # CPU on both sides (fork, authentication, catalogue caches), once per
    # request or worker message without it. Statements are bound on the
    # server and prepared after their 5th use on a connection, so the hot
    # path's few statement shapes are parsed and planned once per connection.
    # DATABASE_POOL_MAX_SIZE bounds each process (worker threads + 2 is enough).
    if env.bool("DATABASE_POOL", default=True):
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env.int("DATABASE_POOL_MIN_SIZE", default=1),
            "max_size": env.int("DATABASE_POOL_MAX_SIZE", default=20),
            "timeout": env.float("DATABASE_POOL_TIMEOUT_S", default=30.0),
        }
    if env.bool("DATABASE_PREPARED_STATEMENTS", default=True):
        DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Pages in English or Simplified Chinese (README "Languages and time
# zones"); the catalogue is config/locale, compiled .mo files committed.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "config" / "locale"]
# Datetimes without an explicit format (the admin's) keep their seconds.
FORMAT_MODULE_PATH = ["config.formats"]
# Stored in UTC; pages show times in the zone of the browser's
# "tollgate_tz" cookie (static/js/timezone.js), UTC without one.
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "static"
# Serve from the app and project static folders too, so a server works
# before (or without) collectstatic.
WHITENOISE_USE_FINDERS = True
# Until collectstatic has run, STATIC_ROOT does not exist; the finders serve.
warnings.filterwarnings("ignore", message="No directory at: .*static", category=UserWarning)

# Uploaded files (answers to questions) are kept through Django's default
# storage here; nothing serves this folder: downloads go through a view
# that checks who may see the run.
MEDIA_ROOT = env.path("MEDIA_ROOT", default=BASE_DIR / "var" / "media")

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"  # the inbox for deciders, the run list for requesters
LOGOUT_REDIRECT_URL = "login"

EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="tollgate@localhost")

# Largest request body the API accepts (bytes); larger ones get 413/400.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=1_048_576)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "config.authentication.TokenAuthentication",  # DRF's, its lookup built once (runs.base.selects)
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON with a nesting limit and no NaN/Infinity/NUL (config.strict_json).
    "DEFAULT_PARSER_CLASSES": ["config.strict_json.StrictJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Every error answer is {"error": {"code", "message", "details"}}.
    "EXCEPTION_HANDLER": "config.api.exception_handler",
    # Lists: cursor pages (?cursor=, ?page_size= up to 1000) and
    # django-filter query parameters (an invalid value is a 400).
    "DEFAULT_PAGINATION_CLASS": "config.pagination.NewestFirstCursorPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # Per user (a token is its user's) and per client address for anonymous
    # requests; starting runs has its own, tighter rate. Over it: 429 with
    # Retry-After. Counted in the default cache (CACHE_URL).
    # DRF's, each deciding one request per key at a time (config.throttles).
    "DEFAULT_THROTTLE_CLASSES": [
        "config.throttles.AnonRateThrottle",
        "config.throttles.UserRateThrottle",
        "config.throttles.ScopedRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env.str("THROTTLE_ANON", default="60/min"),
        "user": env.str("THROTTLE_USER", default="600/min"),
        "runs": env.str("THROTTLE_RUNS", default="30/min"),
    },
    # How many proxies of our own stand in front and append to
    # X-Forwarded-For: the client's address is the entry that many places
    # from its end. 0 (the default): the header is the client's to write, so
    # it is ignored and the connection's address (REMOTE_ADDR) counts.
    "NUM_PROXIES": env.int("TOLLGATE_TRUSTED_PROXIES", default=0),
}
if not 0 <= REST_FRAMEWORK["NUM_PROXIES"] <= 10:
    raise ImproperlyConfigured("TOLLGATE_TRUSTED_PROXIES must be from 0 to 10 (proxies of your own in front).")

# The throttle counters live here: in-process by default; give every server
# process the same one in production (e.g. CACHE_URL=redis://host:6379/1).
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tollgate API",
    "DESCRIPTION": "Durable, auditable LLM agent runs with human approval.",
    "VERSION": "0.1.0",
    # The schema describes every endpoint: only for logged-in users.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "ENUM_NAME_OVERRIDES": {"WebhookEventTypeEnum": "runs.webhooks.models.EventType"},
    # Swagger UI (/api/docs/) from drf-spectacular-sidecar's static files:
    # nothing is loaded from another site, so it works under the CSP above.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The long-poll wait (not a DRF view), then the error object and the
    # Idempotency-Key header on every operation.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.api.waits.document_run_wait",
        "config.api_schema.document_errors_and_idempotency",
    ],
}

# Keys sent in an Idempotency-Key header are remembered this long (hours).
API_IDEMPOTENCY_TTL_HOURS = env.int("API_IDEMPOTENCY_TTL_HOURS", default=24)

# --- Broker and channel layer -------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")

_DRAMATIQ_MIDDLEWARE = [
    "dramatiq.middleware.AgeLimit",
    "dramatiq.middleware.TimeLimit",
    "dramatiq.middleware.Retries",
    # A broker thread keeps its database connection between messages (runs.engine.worker_middleware).
    "runs.engine.worker_middleware.ConnectionsMiddleware",
    # Every worker process beats a heartbeat row while it runs (runs.engine.heartbeat).
    "runs.engine.worker_middleware.HeartbeatMiddleware",
    # Queue lag and Dramatiq's message metrics in /metrics (runs.base.process_metrics).
    "runs.engine.worker_middleware.MetricsMiddleware",
    # A stopping worker removes its flight recorder's box (runs.base.flight_recorder).
    "runs.engine.worker_middleware.FlightRecorderMiddleware",
    # Once booted, a worker freezes what it imported out of the collector's walks (runs.base.collector).
    "runs.engine.worker_middleware.CollectorMiddleware",
]
if REDIS_URL:
    # Dramatiq's Redis broker with a doorbell per queue (runs/base/brokers.py): an
    # idle consumer blocks on it (BLPOP) and fetches as soon as a message is
    # enqueued, instead of sleeping out DRAMATIQ_POLL_MS; with nothing to do
    # it looks at the queue itself every DRAMATIQ_IDLE_WAIT_MS.
    DRAMATIQ_BROKER = {
        "BROKER": "runs.base.brokers.NotifyingRedisBroker",
        "OPTIONS": {"url": REDIS_URL, "namespace": env.str("DRAMATIQ_NAMESPACE", default="tollgate"),
                    "idle_wait_ms": env.int("DRAMATIQ_IDLE_WAIT_MS", default=1000)},
        "MIDDLEWARE": _DRAMATIQ_MIDDLEWARE,
    }
    # Live pushes go over Redis pub/sub (channels_redis's RedisPubSubChannelLayer):
    # a group send is one PUBLISH, and each ASGI process that has sockets in
    # the group hands the message to them itself. Nothing is stored for a
    # socket that is not listening, which suits pushes that a client re-reads
    # on reconnect anyway. The list-based RedisChannelLayer costs a worker
    # several Redis commands per group per push, and the run list's group
    # reaches every open list page.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                "prefix": env.str("CHANNELS_PREFIX", default="tollgate"),
            },
        }
    }
else:
    DRAMATIQ_BROKER = {"BROKER": "dramatiq.brokers.stub.StubBroker", "OPTIONS": {}, "MIDDLEWARE": _DRAMATIQ_MIDDLEWARE}
    # In-memory, but safe to publish to from the in-process worker's threads.
    CHANNEL_LAYERS = {"default": {"BACKEND": "runs.base.channel_layers.LoopSafeInMemoryChannelLayer"}}

# Dramatiq's worker timeout: a consumer with no room for more messages, or
# one holding delayed messages whose time has not come, looks again after
# at most this many milliseconds (an idle one with Redis waits on its
# doorbell instead, see above; with Dramatiq's plain Redis broker every idle
# consumer would poll at this interval). Dramatiq's default, 1,000 ms, was
# most of the time from an approval to its tool's start. Dramatiq
# reads it from the environment when ``dramatiq.worker`` is imported;
# ``rundramatiq`` execs the ``dramatiq`` command, which inherits it.
DRAMATIQ_POLL_MS = env.int("DRAMATIQ_POLL_MS", default=20)
if not 1 <= DRAMATIQ_POLL_MS <= 60_000:
    raise ImproperlyConfigured("DRAMATIQ_POLL_MS must be from 1 to 60000 (milliseconds).")
if REDIS_URL and not 1 <= DRAMATIQ_BROKER["OPTIONS"]["idle_wait_ms"] <= 60_000:
    raise ImproperlyConfigured("DRAMATIQ_IDLE_WAIT_MS must be from 1 to 60000 (milliseconds).")
os.environ.setdefault("dramatiq_worker_timeout", str(DRAMATIQ_POLL_MS))

DRAMATIQ_TASKS_DATABASE = "default"
DRAMATIQ_AUTODISCOVER_MODULES = ["engine.actors"]

# --- Runtime ---------------------------------------------------------------
# Largest file answering a question (TOLLGATE["ANSWER_FILE_MAX_BYTES"]), also a part of the body limit.
_ANSWER_FILE_MAX_BYTES = env.int("TOLLGATE_ANSWER_FILE_MAX_BYTES", default=5 * 1024 * 1024)
TOLLGATE = {
    # Crash-test failpoints (runs/base/failpoints.py); empty in normal operation.
    "FAILPOINTS": env.list("TOLLGATE_FAILPOINTS", default=[]),
    # Seconds a worker's lease on a run lasts without a heartbeat; the
    # heartbeat renews it every third of that.
    "LEASE_TTL_S": env.float("TOLLGATE_LEASE_TTL_S", default=30.0),
    # The engine (runs/engine/runtime.py), per worker process: runs in
    # flight at once (their model and tool calls are awaited on one event
    # loop, holding no thread), threads (so database connections) that do
    # the runs' database work, and threads that run sync tool handlers.
    "RUNS_IN_FLIGHT": env.int("TOLLGATE_RUNS_IN_FLIGHT", default=1000),
    "ENGINE_DB_THREADS": env.int("TOLLGATE_ENGINE_DB_THREADS", default=4),
    # At most this many runs' database work (each run's between two calls)
    # one of those threads commits in one transaction when it is ready at
    # once (runs/engine/group_commit.py); 1 commits each on its own. 1 on
    # SQLite, which lets one writer in at a time: a group would hold that
    # lock for all its jobs, and lease renewals would wait behind it.
    "ENGINE_GROUP_MAX": env.int("TOLLGATE_ENGINE_GROUP_MAX",
                                default=1 if DATABASES["default"]["ENGINE"].endswith("sqlite3") else 8),
    "TOOL_THREADS": env.int("TOLLGATE_TOOL_THREADS", default=16),
    # Seconds one model call may take in all (a stream that keeps coming
    # included); the provider's own timeout bounds each wait within it.
    "MODEL_CALL_MAX_S": env.float("TOLLGATE_MODEL_CALL_MAX_S", default=600.0),
    # Backoff before a transiently failed model call is tried again (the
    # engine retries, MODEL_MAX_RETRIES times): the server's Retry-After,
    # else from this many seconds, doubling, with full jitter.
    "MODEL_BACKOFF_S": env.float("TOLLGATE_MODEL_BACKOFF_S", default=2.0),
    # Live sockets re-check their user's access when told it changed (a
    # logout, a group or permission change) and, as a backstop, before an
    # event when their last check is older than this many seconds.
    "LIVE_ACCESS_RECHECK_S": env.float("TOLLGATE_LIVE_ACCESS_RECHECK_S", default=60.0),
    # Each Dramatiq worker process records a heartbeat (runs.ops.models.
    # WorkerHeartbeat) every this many seconds; one that missed three is
    # shown stale, and its row is deleted this long after its last beat.
    "WORKER_HEARTBEAT_S": env.float("TOLLGATE_WORKER_HEARTBEAT_S", default=15.0),
    "WORKER_PRUNE_AFTER_S": env.float("TOLLGATE_WORKER_PRUNE_AFTER_S", default=24 * 3600.0),
    # /metrics (runs.ops.metrics): closed (404) while empty; set, a scrape
    # must send "Authorization: Bearer <this token>" (else 401). A secret:
    # at least 32 characters.
    "METRICS_TOKEN": os.environ.get("TOLLGATE_METRICS_TOKEN", ""),
    # Seconds between two passes of the sweeper (recover_runs --loop, serve).
    "SWEEP_INTERVAL_S": env.float("TOLLGATE_SWEEP_INTERVAL_S", default=10.0),
    # A queued run with no lease older than this is re-enqueued (its
    # broker message may have been lost).
    "QUEUED_GRACE_S": env.float("TOLLGATE_QUEUED_GRACE_S", default=30.0),
    # At most this many runs are sent back per sweeper pass (the rest wait
    # for the next pass), so recovery never floods the broker.
    "SWEEP_MAX_RESENDS": env.int("TOLLGATE_SWEEP_MAX_RESENDS", default=500),
    # At most this many due items of each kind per sweeper pass (expired
    # approvals, timers, scheduled starts, deadlines, reconciliations after
    # a run ended), oldest first; the rest wait for the next pass, so a
    # pass stays short however much falls due at once.
    "SWEEP_BATCH": env.int("TOLLGATE_SWEEP_BATCH", default=200),
    # Retry backoffs up to this many seconds are slept in the worker;
    # longer ones put the run in waiting/retry_backoff with wake_at.
    "INLINE_BACKOFF_MAX_S": env.float("TOLLGATE_INLINE_BACKOFF_MAX_S", default=2.0),
    # Automatic reconciliation: first delay (seconds), doubling, and the
    # number of tries before a person is asked.
    "RECONCILE_BACKOFF_S": env.float("TOLLGATE_RECONCILE_BACKOFF_S", default=1.0),
    "RECONCILE_MAX_TRIES": env.int("TOLLGATE_RECONCILE_MAX_TRIES", default=5),
    # Model turns whose tool calls were all invalid before the run fails
    # with failure_type=invalid_model_output.
    "MAX_REPAIR_TURNS": env.int("TOLLGATE_MAX_REPAIR_TURNS", default=2),
    # Workers that may die in a row on the same step (a model call or a
    # tool call in flight) before the run fails with failure_type=crash_loop.
    "MAX_CRASHES_PER_STEP": env.int("TOLLGATE_MAX_CRASHES_PER_STEP", default=3),
    # Deaths in a row with work in flight, whoever was blamed, that end a
    # run all the same (a bound for a culprit that is never singled out).
    "MAX_LOSSES_PER_STEP": env.int("TOLLGATE_MAX_LOSSES_PER_STEP", default=10),
    # A run whose worker died with it blamed, or this many times in a row
    # with work in flight and no flight recorder to clear it, is advanced
    # alone in its process next time, so that a step that kills its worker
    # takes no other run down and is blamed exactly (runs.engine.runtime).
    "ISOLATE_AFTER_LOSSES": env.int("TOLLGATE_ISOLATE_AFTER_LOSSES", default=2),
    # Suspects a worker process advances together in quarantine, with no
    # other run in flight (a run blamed for a death is advanced alone).
    "QUARANTINE_SIZE": env.int("TOLLGATE_QUARANTINE_SIZE", default=8),
    # A Dramatiq queue of their own for suspects, consumed by worker processes
    # that take nothing else (`rundramatiq --queues <it>`; the others then
    # `--queues default`): a process advancing a suspect in quarantine empties
    # first, so it had better be one that holds no other runs. Empty (the
    # default): every worker process quarantines its own suspects.
    "QUARANTINE_QUEUE": env.str("TOLLGATE_QUARANTINE_QUEUE", default=""),
    # Where each worker process keeps its flight recorder (which run's code
    # each of its threads runs; runs.base.flight_recorder), read by a sweeper
    # on the same host when the process dies: this installation's own, made
    # private to its user (mode 0700; refused if others may write to it).
    "FLIGHT_RECORDER_DIR": env.str("TOLLGATE_FLIGHT_RECORDER_DIR", default=str(BASE_DIR / "var" / "flight-recorder")),
    # A run whose worker died is sent back after a random delay of up to
    # CRASH_BACKOFF_S * 2**crash_streak seconds, so the runs of one dead
    # worker do not land together on the next one.
    "CRASH_BACKOFF_S": env.float("TOLLGATE_CRASH_BACKOFF_S", default=2.0),
    # Model calls per run when the agent sets no max_model_calls, so that
    # no configuration can bill without end.
    "DEFAULT_MAX_MODEL_CALLS": env.int("TOLLGATE_DEFAULT_MAX_MODEL_CALLS", default=50),
    # Times the model is told "not complete yet" before failed/incomplete.
    "MAX_INCOMPLETE_NUDGES": env.int("TOLLGATE_MAX_INCOMPLETE_NUDGES", default=2),
    # Default hours before a pending approval expires.
    "APPROVAL_TTL_HOURS": env.int("TOLLGATE_APPROVAL_TTL_HOURS", default=72),
    # --- Notifications (approvals.notifications) ---
    # The address of this site as people reach it, for the links in emails.
    "SITE_URL": env.str("TOLLGATE_SITE_URL", default="http://127.0.0.1:8000"),
    # The claimer of a pending item is told this many hours before it expires (once).
    "CLAIM_EXPIRY_WARNING_HOURS": env.float("TOLLGATE_CLAIM_EXPIRY_WARNING_HOURS", default=4.0),
    # --- Waits (tools.waits, tools.builtin) ---
    # Hours before a question to the requester (ask_user) expires unanswered.
    "INPUT_TTL_HOURS": env.int("TOLLGATE_INPUT_TTL_HOURS", default=72),
    # Longest wait (seconds) a run may take: wait_until, wait_for_event's
    # timeout_s and a run's start_at are bounded by it.
    "MAX_WAIT_S": env.int("TOLLGATE_MAX_WAIT_S", default=7 * 24 * 3600),
    # Largest external event payload (bytes of JSON) POST /api/events/ takes;
    # it becomes a tool result the model reads.
    "MAX_EVENT_PAYLOAD_BYTES": env.int("TOLLGATE_MAX_EVENT_PAYLOAD_BYTES", default=65_536),
    # Largest accepted run input (characters).
    "MAX_INPUT_CHARS": env.int("TOLLGATE_MAX_INPUT_CHARS", default=20_000),
    # Most runs one POST /api/runs/batch/ starts. Each also counts against
    # the "runs" throttle rate, so a batch holds at most that rate's count
    # (30 by default); a JSON body's limit (DATA_UPLOAD_MAX_MEMORY_SIZE, 1 MiB: 413)
    # bounds it too.
    "RUN_BATCH_MAX": env.int("TOLLGATE_RUN_BATCH_MAX", default=100),
    # Longest model output stored (characters): an answer's text, or one tool
    # call's raw arguments. Longer text is refused (runs.base.model_output) and the
    # model told so; it is never stored.
    "MAX_MODEL_TEXT_CHARS": env.int("TOLLGATE_MAX_MODEL_TEXT_CHARS", default=100_000),
    # --- Files answering a question (ask_user with "file"; approvals.answer_files) ---
    # Largest file (bytes); a larger one is refused with 413.
    "ANSWER_FILE_MAX_BYTES": _ANSWER_FILE_MAX_BYTES,
    # Content types a file may have, decided from its bytes (a question may
    # narrow the list, never widen it).
    "ANSWER_FILE_TYPES": env.list("TOLLGATE_ANSWER_FILE_TYPES", default=[
        "application/pdf", "image/png", "image/jpeg", "text/plain", "text/csv", "application/json"]),
    # Characters of a text file's content the model is given with its metadata.
    "ANSWER_FILE_TEXT_CHARS": env.int("TOLLGATE_ANSWER_FILE_TEXT_CHARS", default=20_000),
    # Largest request body (bytes) the server reads, on every route and before
    # anyone is authenticated (config.body_limit): a larger Content-Length is
    # answered 413 at once, unread; a body that grows past it while arriving
    # is cut off (413, connection closed). Default: the largest legitimate
    # body, an answer file with the rest of its form
    # (ANSWER_FILE_MAX_BYTES + DATA_UPLOAD_MAX_MEMORY_SIZE; 6 MiB).
    "REQUEST_BODY_MAX_BYTES": env.int("TOLLGATE_REQUEST_BODY_MAX_BYTES",
                                      default=_ANSWER_FILE_MAX_BYTES + DATA_UPLOAD_MAX_MEMORY_SIZE),
    # --- Integrators' WebSockets (config.ws_throttle) ---
    # Connection attempts allowed per API token offered and per client
    # address (DRF's rate syntax: <count>/<s|min|hour|day>); one over either
    # is closed with code 4429. Counted in the default cache (CACHE_URL).
    "WS_CONNECT_RATES": {"token": env.str("THROTTLE_WS_TOKEN", default="30/min"),
                         "address": env.str("THROTTLE_WS_ADDRESS", default="60/min")},
    # --- Webhooks (runs.webhooks) ---
    # Seconds between a failed delivery attempt and the next: attempt n+1
    # waits entry n; when the list is used up the delivery is "failed"
    # (default: 10 attempts over about 34 hours).
    "WEBHOOK_RETRY_SCHEDULE_S": [float(seconds) for seconds in env.list(
        "TOLLGATE_WEBHOOK_RETRY_SCHEDULE_S",
        default=[10, 30, 120, 600, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 12 * 3600])],
    # Seconds each phase of an attempt (connect, send, wait for the answer)
    # may take; an attempt holds its delivery for three times this.
    "WEBHOOK_TIMEOUT_S": env.float("TOLLGATE_WEBHOOK_TIMEOUT_S", default=10.0),
    # Host names and addresses or networks (e.g. 10.1.2.0/24) a subscription
    # may point at although they are this server, loopback or private.
    "WEBHOOK_ALLOWED_HOSTS": env.list("TOLLGATE_WEBHOOK_ALLOWED_HOSTS", default=[]),
    # Let subscriptions point at private networks (10/8, 172.16/12,
    # 192.168/16, 100.64/10, fc00::/7); never loopback or metadata addresses.
    "WEBHOOK_ALLOW_PRIVATE_NETWORKS": env.bool("TOLLGATE_WEBHOOK_ALLOW_PRIVATE_NETWORKS", default=False),
    # Accept plain http:// endpoints (bodies are signed, not encrypted).
    "WEBHOOK_ALLOW_HTTP": env.bool("TOLLGATE_WEBHOOK_ALLOW_HTTP", default=False),
    "WEBHOOK_MAX_SUBSCRIPTIONS_PER_USER": env.int("TOLLGATE_WEBHOOK_MAX_SUBSCRIPTIONS_PER_USER", default=20),
    # Delivery attempts one user's subscriptions may have under way at once,
    # across every worker (counted in the database): a user whose endpoints
    # answer slowly holds at most this many webhook worker threads. Give the
    # webhook workers more threads than this (serve --webhook-threads).
    "WEBHOOK_MAX_IN_FLIGHT_PER_USER": env.int("TOLLGATE_WEBHOOK_MAX_IN_FLIGHT_PER_USER", default=2),
    # Largest metadata object of a session, as compact UTF-8 JSON (bytes).
    "MAX_SESSION_METADATA_BYTES": env.int("TOLLGATE_MAX_SESSION_METADATA_BYTES", default=16_384),
    # --- HTTP tools (tools.http; docs/integrating.md) ---
    # The integrators' services that HTTP tools call, by profile name:
    # {"base_url", "secret_env" (the variable holding the whsec_ signing
    # secret, never the secret itself), "allowed_hosts"?, "allow_private_networks"?,
    # "allow_http"?, "max_response_bytes"?}. Checked at start.
    "TOOL_ENDPOINTS": env.json("TOLLGATE_TOOL_ENDPOINTS", default={}),
    # HTTP tools declared without code: a JSON list of objects {"name",
    # "description", "parameters", "endpoint", "path", "side_effect"?,
    # "approval"?, "timeout_s"?, "reconcile_path"?, "result_schema"?, ...}
    # (tools.http.http_tool's arguments). Registered, and checked, at start.
    "HTTP_TOOLS": env.json("TOLLGATE_HTTP_TOOLS", default=[]),
    # Record prompt and completion text on model-call spans (runs.base.tracing), credentials masked; off: only
    # sizes, tokens and names are recorded.
    "TRACE_CONTENT": env.bool("TOLLGATE_TRACE_CONTENT", default=False),
    # --- MCP servers (tools.mcp) ---
    # Remote MCP servers whose tools agents may name ("crm.lookup" or
    # "crm.*"), by server name: {"url": "https://...", "auth_header_env"?:
    # the environment variable holding the Authorization header's value,
    # "auth_header"?: another header name, "timeout_s"?: seconds a call may
    # take (default 30), "max_attempts"? / "backoff_s"?: sends of a read-only
    # call while the server is unreachable (default 5) and the first backoff
    # (default 1 s, doubling, full jitter), "rules"?: {tool: approval rule} replacing the rule
    # the annotations give}. A JSON object in TOLLGATE_MCP_SERVERS, e.g.
    # {"crm": {"url": "https://crm.example.com/mcp", "auth_header_env":
    # "CRM_MCP_AUTH"}}. The URL rules of webhooks apply (TOLLGATE_WEBHOOK_*).
    "MCP_SERVERS": env.json("TOLLGATE_MCP_SERVERS", default={}),
    # Largest result of one MCP tool call kept (bytes of JSON); a non-text
    # block is kept as {type, mimeType, size}, never its data.
    "MCP_MAX_RESULT_BYTES": env.int("TOLLGATE_MCP_MAX_RESULT_BYTES", default=262_144),
    # --- Model providers (runs.providers.http_config) ---
    # Endpoint profiles an agent's model config names with "endpoint"
    # (default: the provider's name): {"provider", "base_url"?,
    # "api_key_env"?}. Add or override profiles with a JSON object in
    # TOLLGATE_MODEL_ENDPOINTS, e.g. {"local": {"provider": "openai",
    # "base_url": "http://127.0.0.1:11434/v1"}}.
    "MODEL_ENDPOINTS": {
        "openai": {"provider": "openai", "api_key_env": "OPENAI_API_KEY"},
        "anthropic": {"provider": "anthropic", "api_key_env": "ANTHROPIC_API_KEY"},
        **env.json("TOLLGATE_MODEL_ENDPOINTS", default={}),
    },
    # Let agent configs carry their own base_url / api_key_env (any host,
    # any server variable): only for a trusted, single-operator setup.
    "ALLOW_AGENT_ENDPOINTS": env.bool("TOLLGATE_ALLOW_AGENT_ENDPOINTS", default=False),
    # Seconds the model SDK waits for each connect and read of one call (the
    # longest silence from the server, not the whole answer); more than 0.
    "MODEL_TIMEOUT_S": env.float("TOLLGATE_MODEL_TIMEOUT_S", default=120.0),
    # Retries of a transient model error (connection, timeout, 408/409/429/
    # 5xx; Retry-After honoured), made by the engine: the SDK makes one attempt.
    "MODEL_MAX_RETRIES": env.int("TOLLGATE_MODEL_MAX_RETRIES", default=3),
    # Output tokens asked for when an agent sets no max_output_tokens
    # (the Anthropic API requires a value).
    "DEFAULT_MAX_OUTPUT_TOKENS": env.int("TOLLGATE_DEFAULT_MAX_OUTPUT_TOKENS", default=4096),
    # Context window (tokens, estimated as characters / 4) when the agent's
    # model config has no "context_window" (runs.engine.context).
    "CONTEXT_MAX_TOKENS": env.int("TOLLGATE_CONTEXT_MAX_TOKENS", default=100_000),
    # US dollars per million tokens, by the config's "model" name; used for
    # Run.cost_usd / Step.cost_usd and the max_cost_usd budget. A model
    # missing here costs 0, and an agent with max_cost_usd cannot use it.
    "MODEL_PRICES": {
        "gpt-4o": {"input_per_mtok": 2.50, "output_per_mtok": 10.00},
        "gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.60},
        "gpt-4.1": {"input_per_mtok": 2.00, "output_per_mtok": 8.00},
        "gpt-4.1-mini": {"input_per_mtok": 0.40, "output_per_mtok": 1.60},
        "claude-sonnet-4-5": {"input_per_mtok": 3.00, "output_per_mtok": 15.00},
        "claude-haiku-4-5": {"input_per_mtok": 1.00, "output_per_mtok": 5.00},
        "claude-opus-4-1": {"input_per_mtok": 15.00, "output_per_mtok": 75.00},
    },
}
if TOLLGATE["REQUEST_BODY_MAX_BYTES"] < _ANSWER_FILE_MAX_BYTES + DATA_UPLOAD_MAX_MEMORY_SIZE:
    # A smaller limit would refuse answer files the answer-file limit allows, with a 413 nobody could explain.
    raise ImproperlyConfigured(
        "TOLLGATE_REQUEST_BODY_MAX_BYTES must be at least TOLLGATE_ANSWER_FILE_MAX_BYTES + "
        f"DATA_UPLOAD_MAX_MEMORY_SIZE ({_ANSWER_FILE_MAX_BYTES + DATA_UPLOAD_MAX_MEMORY_SIZE} bytes).")

if not TOLLGATE["MODEL_TIMEOUT_S"] > 0:  # the model clients' transport reads 0 as no timeout at all
    raise ImproperlyConfigured("TOLLGATE_MODEL_TIMEOUT_S must be greater than 0 (seconds).")

if TOLLGATE["METRICS_TOKEN"] and len(TOLLGATE["METRICS_TOKEN"]) < 32:
    raise ImproperlyConfigured("TOLLGATE_METRICS_TOKEN must be at least 32 characters (or empty: /metrics closed).")

# Everything to the console, each record with the ids of the run it is about
# (runs.base.log_context): as text (the message, then "[run 12 session 3
# tool_call 7]") or, with TOLLGATE_LOG_FORMAT=json, one JSON object a line.
LOG_FORMAT = env.str("TOLLGATE_LOG_FORMAT", default="text")
if LOG_FORMAT not in FORMATS:
    raise ImproperlyConfigured(f"TOLLGATE_LOG_FORMAT must be one of {', '.join(FORMATS)}.")
LOGGING = logging_settings(LOG_FORMAT, env.str("LOG_LEVEL", default="WARNING"))
