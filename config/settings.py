"""Tandem's settings, read from the environment with development defaults.

Development (DEBUG=1, what `make run` and `make test` use) needs no configuration at all:
SQLite under var/, Redis on 127.0.0.1:6379, a generated secret key. Production (DEBUG=0,
the default) refuses to start without SECRET_KEY and ALLOWED_HOSTS and turns on the
HTTPS-only protections that `manage.py check --deploy` asks for.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_list, env_str
from config.secret import dev_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("TANDEM_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off. For development, set DEBUG=1 "
            "(make run and make test do) and a key is generated under var/."
        )
    SECRET_KEY = dev_secret_key(VAR_DIR / "dev-secret-key")

# Rotation (docs/security.md): the new key in SECRET_KEY, the old one here until sessions and
# signed values made with it have expired.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS must be set when DEBUG is off, e.g. ALLOWED_HOSTS=chat.example.com"
    )
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "inference",
    "chat",
    "media",
    "ops",
    "axes",
]

MIDDLEWARE = [
    "config.request_id.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before sessions and auth: their reads fail in the view when the database is down.
    "config.database_unavailable.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lock-out page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

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

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'tandem.sqlite3'}")
# Health checks: a pooled connection is tested before it is handed out, so the connections
# left dead by a database restart are replaced, not given to requests.
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=0, conn_health_checks=True)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend behind a gate: while the server is down, connecting fails at once
    # (a 503 from config.database_unavailable) instead of waiting the pool's 30 s.
    DATABASES["default"]["ENGINE"] = "config.postgres"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory, so that the Daphne and Celery processes a test starts share it
    # (they are handed its path); one per test run, so concurrent runs never collide.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-tandem-{os.getpid()}.sqlite3")}
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # Concurrent requests each write in their own thread: a transaction that began as a reader
    # and then writes fails at once with "database is locked" (no waiting, SQLite's deadlock
    # rule). Taking the write lock at BEGIN makes it wait for the timeout instead.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    # WAL: readers (sessions, snapshots) never block the one writer, nor it them.
    DATABASES["default"]["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL;"

# Each request in flight holds a connection of its own: a burst of 200 turns went past
# PostgreSQL's max_connections (100) and got 500s. A pool per process makes a request wait up
# to `timeout` seconds for a free connection instead. 0 turns pooling off.
DATABASE_POOL_SIZE = env_int("DATABASE_POOL_SIZE", 10)
if DATABASES["default"]["ENGINE"] == "config.postgres" and DATABASE_POOL_SIZE:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DATABASE_POOL_SIZE,
        "timeout": 30,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes checks every login first: after TANDEM_LOGIN_FAILURE_LIMIT wrong passwords for
# one username from one address, that pair is refused for TANDEM_LOGIN_COOLOFF_MINUTES.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TANDEM_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("TANDEM_LOGIN_COOLOFF_MINUTES", 15))
# Per username and address together: a guesser is stopped, and a user whose name someone else
# is guessing can still sign in from their own address.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "static")))
if DEBUG:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on a missing root
MEDIA_URL = "media/"
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(VAR_DIR / "media")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "config.storage.StaticFilesStorage"
    },
}

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# The chat's live events do not use the channel layer: they are Redis pub/sub, one PUBLISH per
# event and one subscription per process (chat/events.py, chat/fanout.py), named with this
# prefix. The layer carries the diagnostic echo socket (chat/consumers.py EchoConsumer).
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py's default 5 s read timeout equals the layer's blocking wait, which
            # made an idle receive() fail; give the socket room above it.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "prefix": env_str("TANDEM_CHANNEL_PREFIX", "tandem"),
        },
    }
}

# Images (media/, docs/workers.md): which backend draws them and how the worker runs it.
# procedural: a deterministic PNG drawn from the prompt with Pillow, no weights;
# diffusers: a text-to-image pipeline from TANDEM_IMAGE_MODEL_DIR (in requirements.txt).
TANDEM_IMAGE_BACKEND = env_str("TANDEM_IMAGE_BACKEND", "procedural")
if TANDEM_IMAGE_BACKEND not in ("procedural", "diffusers"):
    raise ImproperlyConfigured(
        f"TANDEM_IMAGE_BACKEND must be procedural or diffusers, not {TANDEM_IMAGE_BACKEND!r}."
    )
TANDEM_IMAGE_MODEL_DIR = env_str("TANDEM_IMAGE_MODEL_DIR", "")
TANDEM_IMAGE_STEPS = max(1, env_int("TANDEM_IMAGE_STEPS", 12))
# Seconds the procedural backend waits per step, so the pending image is visible (12 x 0.2 s).
TANDEM_IMAGE_STEP_DELAY = env_float("TANDEM_IMAGE_STEP_DELAY", 0.2)
# Chance (0..1) that a render fails on purpose halfway, as a transient error: demos and tests.
TANDEM_IMAGE_FAILURE_RATE = env_float("TANDEM_IMAGE_FAILURE_RATE", 0.0)
if not 0 <= TANDEM_IMAGE_FAILURE_RATE <= 1:
    raise ImproperlyConfigured("TANDEM_IMAGE_FAILURE_RATE must be between 0 and 1.")
# Transient errors are retried this many times, after base * 2^n s (capped, with jitter).
TANDEM_IMAGE_MAX_RETRIES = env_int("TANDEM_IMAGE_MAX_RETRIES", 3)
TANDEM_IMAGE_RETRY_BACKOFF = env_float("TANDEM_IMAGE_RETRY_BACKOFF", 2.0)
TANDEM_IMAGE_RETRY_BACKOFF_MAX = env_float("TANDEM_IMAGE_RETRY_BACKOFF_MAX", 30.0)
# The sweeper (celery beat): how often it runs; when a queued image is sent again; how long
# past the hard time limit a running image may go before its worker counts as gone.
TANDEM_SWEEP_INTERVAL = env_int("TANDEM_SWEEP_INTERVAL", 15)
TANDEM_QUEUED_STALE_AFTER = env_int("TANDEM_QUEUED_STALE_AFTER", 60)
TANDEM_RUNNING_GRACE = env_int("TANDEM_RUNNING_GRACE", 120)
# The admin's "stuck" filter: parts not final this many seconds after they were queued.
TANDEM_STUCK_AFTER = env_int("TANDEM_STUCK_AFTER", 300)

# Celery reads every CELERY_* setting (namespace CELERY in config/celery.py).
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True  # state lives in the database rows, not in results
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_DEFAULT_QUEUE = "media"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("TANDEM_IMAGE_SOFT_TIME_LIMIT", 60)
CELERY_TASK_TIME_LIMIT = env_int("TANDEM_IMAGE_TIME_LIMIT", 90)
if CELERY_TASK_SOFT_TIME_LIMIT >= CELERY_TASK_TIME_LIMIT:
    raise ImproperlyConfigured(
        "TANDEM_IMAGE_SOFT_TIME_LIMIT must be below TANDEM_IMAGE_TIME_LIMIT, or it never fires."
    )
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Above the hard limit, so an unacked task is redelivered only once its worker is gone.
    "visibility_timeout": CELERY_TASK_TIME_LIMIT + env_int("TANDEM_VISIBILITY_MARGIN", 60),
    # Look for such orphans every 10 s (kombu's default scans only every 10th time).
    "unacked_restore_throttle": 1,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker that lost the broker tries again every second (media/consumer.py), for as long as
# it takes: kombu's own 2, 4 … 30 s intervals left images waiting after Redis was back.
CELERY_WORKER_CONSUMER = "media.consumer:Consumer"
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "sweep": {
        "task": "media.sweep",
        "schedule": float(TANDEM_SWEEP_INTERVAL),
        # A sweep not started before the next one is due is dropped, never piled up.
        "options": {"expires": TANDEM_SWEEP_INTERVAL},
    }
}

TANDEM_MODEL = env_str("TANDEM_MODEL", "smollm2-135m-instruct")
TANDEM_DTYPE = env_str("TANDEM_DTYPE", "auto")
# Which weights the engine multiplies by: the dense ones (bf16), the packaged GGUF's own 4-bit
# ones on torch's int4 kernel (q4) or on our own, which rounds the activations to int8 (q4_1),
# the dense ones rounded to int8 per row for torch's kernel (int8) or for our own (q8), a
# float32 model's rounded to float16 for fbgemm's GEMM (fp16), or auto: for a float32 model on
# the CPU q8 where it wins at one row (fp16 above its crossover), else fp16; for a bfloat16 one
# whichever of int8 and q8 is faster at one row on this CPU (measured at start); bf16
# otherwise. q4 (it changes greedy answers) and q4_1 (fastest at one stream, slower than q8
# from two) are opt-in (docs/engine.md, "Weight formats").
TANDEM_WEIGHTS = env_str("TANDEM_WEIGHTS", "auto").lower()
if TANDEM_WEIGHTS not in ("auto", "bf16", "q4", "int8", "q8", "q4_1", "fp16"):
    raise ImproperlyConfigured("TANDEM_WEIGHTS must be auto, bf16, q4, int8, q8, q4_1 or fp16.")
# The decode step compiled by inductor (inference/engine/compiled_decode.py): built in the
# background at start (/health's model.compile says "warming", steps run eagerly meanwhile).
# TANDEM_COMPILE_BUCKETS: the step sizes compiled, in rows (decode tokens plus prompt-chunk
# tokens, padded up to the next bucket; a bigger step runs eagerly). Each costs ~20-90 s of CPU
# to build once (`make compile` builds them ahead), under a second to load after.
TANDEM_COMPILE = env_bool("TANDEM_COMPILE", True)
try:
    TANDEM_COMPILE_BUCKETS = tuple(
        int(size)
        for size in env_list(
            "TANDEM_COMPILE_BUCKETS",
            ["1", "2", "4", "8", "16", "32", "40", "48", "64", "128", "256", "512"],
        )
    )
except ValueError as exc:
    raise ImproperlyConfigured(f"TANDEM_COMPILE_BUCKETS must be integers: {exc}") from exc
if (
    not TANDEM_COMPILE_BUCKETS
    or list(TANDEM_COMPILE_BUCKETS) != sorted(set(TANDEM_COMPILE_BUCKETS))
    or TANDEM_COMPILE_BUCKETS[0] < 1
):
    raise ImproperlyConfigured("TANDEM_COMPILE_BUCKETS must be ascending positive integers.")
# Where the compiled buckets are kept between restarts (inference/engine/compile_cache.py):
# empty = "compiled" inside the converted-model cache (TANDEM_MODEL_CACHE), shared by the
# machine's processes; "off" = built anew by every process and kept by none.
TANDEM_COMPILE_CACHE = env_str("TANDEM_COMPILE_CACHE", "")
# Threads the engine's kernels use (torch.set_num_threads); 0 keeps torch's default (one per
# core).
TANDEM_TORCH_THREADS = env_int("TANDEM_TORCH_THREADS", 0)
TANDEM_LOAD_MODEL = env_bool("TANDEM_LOAD_MODEL", True)
TANDEM_HEALTH_TIMEOUT = env_float("TANDEM_HEALTH_TIMEOUT", 1.0)
# Benchmarks only: `synthetic` swaps the model for a paced stand-in
# (inference/provisioning/synthetic.py) so bench/stream.py measures the streaming path rather
# than the model.
TANDEM_ENGINE_SOURCE = env_str("TANDEM_ENGINE_SOURCE", "model")
if TANDEM_ENGINE_SOURCE not in ("model", "synthetic"):
    raise ImproperlyConfigured("TANDEM_ENGINE_SOURCE must be model or synthetic.")
TANDEM_SYNTHETIC_TOKENS_PER_S = env_float("TANDEM_SYNTHETIC_TOKENS_PER_S", 20.0)
# Where the chat's text comes from (docs/deploy.md): `local`, the engine in this process, or
# one or more OpenAI-compatible base URLs (comma separated; replicas, sticky per conversation)
# that the text streams from, with an optional bearer key. Remote, this process loads no model.
# A URL may end in /v1 or not (`remote_engine.base_url` makes them alike).
# A stream quiet for TANDEM_ENGINE_STALL_TIMEOUT s is interrupted (its text kept).
TANDEM_ENGINE = env_str("TANDEM_ENGINE", "local").strip()
TANDEM_ENGINE_URLS = [] if TANDEM_ENGINE.lower() == "local" else env_list("TANDEM_ENGINE", [])
if any(not url.startswith(("http://", "https://")) for url in TANDEM_ENGINE_URLS):
    raise ImproperlyConfigured(
        f"TANDEM_ENGINE must be local or http(s) base URLs, not {TANDEM_ENGINE!r}."
    )
TANDEM_ENGINE_API_KEY = env_str("TANDEM_ENGINE_API_KEY", "")
TANDEM_ENGINE_STALL_TIMEOUT = env_float("TANDEM_ENGINE_STALL_TIMEOUT", 30.0)
TANDEM_ENGINE_CONNECT_TIMEOUT = env_float("TANDEM_ENGINE_CONNECT_TIMEOUT", 5.0)
# The model name sent upstream; empty asks each URL's /v1/models. The repetition penalty goes as
# an extra field (Tandem, vLLM and TGI take it); 0 for a server that refuses unknown fields.
TANDEM_ENGINE_MODEL = env_str("TANDEM_ENGINE_MODEL", "")
TANDEM_ENGINE_SEND_REPETITION_PENALTY = env_bool("TANDEM_ENGINE_SEND_REPETITION_PENALTY", True)
# What this process serves: `all` (the chat, its admin and the engine) or `engine` (only the
# engine's TGI/OpenAI APIs, /health and /metrics: one engine box behind many web processes).
TANDEM_ROLE = env_str("TANDEM_ROLE", "all").lower()
if TANDEM_ROLE not in ("all", "engine"):
    raise ImproperlyConfigured(f"TANDEM_ROLE must be all or engine, not {TANDEM_ROLE!r}.")
if TANDEM_ROLE == "engine" and TANDEM_ENGINE_URLS:
    raise ImproperlyConfigured("TANDEM_ROLE=engine serves its own engine: TANDEM_ENGINE=local.")
# The engine's capacity: sequences decoded together, requests allowed to wait, tokens fed per
# step (bounds how long one step, and so everyone's next token, can take), and the longest
# sequence a KV slot holds (the model's context window caps it too).
TANDEM_MAX_RUNNING = env_int("TANDEM_MAX_RUNNING", 32)
TANDEM_MAX_WAITING = env_int("TANDEM_MAX_WAITING", 256)
TANDEM_MAX_STEP_TOKENS = env_int("TANDEM_MAX_STEP_TOKENS", 512)
TANDEM_MAX_SEQ_LEN = env_int("TANDEM_MAX_SEQ_LEN", 2048)
# A prompt starting with tokens a free KV slot still holds (the system prompt, a conversation's
# earlier turns) skips prefilling them (docs/engine.md, "Prefix reuse").
TANDEM_PREFIX_REUSE = env_bool("TANDEM_PREFIX_REUSE", True)
TANDEM_DEFAULT_MAX_NEW_TOKENS = env_int("TANDEM_DEFAULT_MAX_NEW_TOKENS", 256)
# The chat: a new conversation's settings (each conversation may change its own), the
# repetition penalty of every reply, input size, and replies in progress per user. The
# sampling defaults were chosen by measuring repetition (docs/chat.md, bench/repetition.py).
TANDEM_CHAT_SYSTEM_PROMPT = env_str(
    "TANDEM_CHAT_SYSTEM_PROMPT",
    "You are Tandem, a helpful assistant. Answer clearly and concisely.",
)
TANDEM_CHAT_MAX_NEW_TOKENS = env_int("TANDEM_CHAT_MAX_NEW_TOKENS", 384)
TANDEM_CHAT_TEMPERATURE = env_float("TANDEM_CHAT_TEMPERATURE", 0.3)
TANDEM_CHAT_TOP_P = env_float("TANDEM_CHAT_TOP_P", 0.9)
TANDEM_CHAT_REPETITION_PENALTY = env_float("TANDEM_CHAT_REPETITION_PENALTY", 1.15)
TANDEM_CHAT_IMAGE_BY_DEFAULT = env_bool("TANDEM_CHAT_IMAGE_BY_DEFAULT", False)
TANDEM_MAX_MESSAGE_CHARS = env_int("TANDEM_MAX_MESSAGE_CHARS", 8000)
TANDEM_MAX_TURNS_IN_FLIGHT = env_int("TANDEM_MAX_TURNS_IN_FLIGHT", 3)
# PostgreSQL's text search configuration for the conversation search (its stemming language).
TANDEM_SEARCH_CONFIG = env_str("TANDEM_SEARCH_CONFIG", "english")
# A web process refreshes its heartbeat key every TTL/3 s; text parts of a process whose key
# expired are marked interrupted by the sweeper.
TANDEM_HEARTBEAT_TTL = env_int("TANDEM_HEARTBEAT_TTL", 30)
# Service bearer keys for the generation API (other Tandem processes, benchmarks); users make
# keys of their own on /keys (inference/api/keys.py).
TANDEM_API_KEYS = env_list("TANDEM_API_KEYS", [])
# Serve the generation API without a key. Unset, it is open only in development while no key
# of any kind exists; with DEBUG off it needs a key (`check --deploy` warns when this is on).
TANDEM_API_OPEN = env_bool("TANDEM_API_OPEN", False)
# Decided here, from DEBUG as the process started (test runners turn DEBUG off later).
TANDEM_API_OPEN_IN_DEVELOPMENT = DEBUG

if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    if env_bool("TRUST_X_FORWARDED_PROTO", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Content-Security-Policy (django-csp, docs/security.md): the templates carry no inline script
# or style, so scripts, styles, images and connections come from this origin only ('self'
# matches its ws:// and wss:// too, for the chat's socket). Violations are posted to
# /csp-report and logged. TANDEM_CSP_REPORT_ONLY=1 sends the same policy as report-only.
_CSP = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        "report-uri": "/csp-report",
    }
}
TANDEM_CSP_REPORT_ONLY = env_bool("TANDEM_CSP_REPORT_ONLY", False)
if TANDEM_CSP_REPORT_ONLY:
    CONTENT_SECURITY_POLICY_REPORT_ONLY = _CSP
else:
    CONTENT_SECURITY_POLICY = _CSP

LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
# One line per event with the request, message, part and task ids (config/logging.py): JSON
# for a log pipeline in production, readable text in development.
TANDEM_LOG_FORMAT = env_str("TANDEM_LOG_FORMAT", "plain" if DEBUG else "json")
if TANDEM_LOG_FORMAT not in ("json", "plain"):
    raise ImproperlyConfigured(
        f"TANDEM_LOG_FORMAT must be json or plain, not {TANDEM_LOG_FORMAT!r}."
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"ids": {"()": "config.logging.ContextFilter"}},
    "formatters": {
        "plain": {
            "()": "config.logging.PlainFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger", "process": "pid"},
            "timestamp": "time",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": TANDEM_LOG_FORMAT,
            "filters": ["ids"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # Django's own console handler would print its lines a second time, unformatted.
    "loggers": {"django": {"handlers": [], "level": LOG_LEVEL}},
}
