"""Tollgate settings, read from the environment (django-environ).

Embedded default (nothing set): SQLite file ``db.sqlite3``, Dramatiq's
StubBroker with an in-process worker, Channels' in-memory layer.
Production shape: set ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL``
(Dramatiq broker and channel layer).
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env.str("SECRET_KEY", default="tollgate-insecure-development-key")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "django_dramatiq",
    "runs",
    "tools",
    "approvals",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

ASGI_APPLICATION = "config.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The in-process worker writes from another thread: wait for the lock
    # instead of failing, and keep the test database in a file that every
    # thread (and a server subprocess, through the inherited environment)
    # can open; one file per test process, so parallel runs do not collide.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 30
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.setdefault("TOLLGATE_SQLITE_TEST_DB", f"/tmp/tollgate-test-{os.getpid()}.sqlite3")
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "static"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "inbox"
LOGOUT_REDIRECT_URL = "login"

EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="tollgate@localhost")

# Largest request body the API accepts (bytes); larger ones get 413/400.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=1_048_576)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.api.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tollgate API",
    "DESCRIPTION": "Durable, auditable LLM agent runs with human approval.",
    "VERSION": "0.1.0",
}

# --- Broker and channel layer -------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")

_DRAMATIQ_MIDDLEWARE = [
    "dramatiq.middleware.AgeLimit",
    "dramatiq.middleware.TimeLimit",
    "dramatiq.middleware.Retries",
    "django_dramatiq.middleware.DbConnectionsMiddleware",
]
if REDIS_URL:
    DRAMATIQ_BROKER = {
        "BROKER": "dramatiq.brokers.redis.RedisBroker",
        "OPTIONS": {"url": REDIS_URL, "namespace": env.str("DRAMATIQ_NAMESPACE", default="tollgate")},
        "MIDDLEWARE": _DRAMATIQ_MIDDLEWARE,
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": env.str("CHANNELS_PREFIX", default="tollgate")},
        }
    }
else:
    DRAMATIQ_BROKER = {"BROKER": "dramatiq.brokers.stub.StubBroker", "OPTIONS": {}, "MIDDLEWARE": _DRAMATIQ_MIDDLEWARE}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

DRAMATIQ_TASKS_DATABASE = "default"
DRAMATIQ_AUTODISCOVER_MODULES = ["actors"]

# --- Runtime ---------------------------------------------------------------
TOLLGATE = {
    # Model turns whose tool calls were all invalid before the run fails
    # with failure_type=invalid_model_output.
    "MAX_REPAIR_TURNS": env.int("TOLLGATE_MAX_REPAIR_TURNS", default=2),
    # Times the model is told "not complete yet" before failed/incomplete.
    "MAX_INCOMPLETE_NUDGES": env.int("TOLLGATE_MAX_INCOMPLETE_NUDGES", default=2),
    # Default hours before a pending approval expires.
    "APPROVAL_TTL_HOURS": env.int("TOLLGATE_APPROVAL_TTL_HOURS", default=72),
    # Largest accepted run input (characters).
    "MAX_INPUT_CHARS": env.int("TOLLGATE_MAX_INPUT_CHARS", default=20_000),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
}
