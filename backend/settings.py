"""Settings of a DeFL node, read from the environment (documented in .env.example).

With nothing set, a node runs on embedded defaults: SQLite, in-process tasks,
a local chunk directory and an in-process EVM.
"""

import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from backend.api.security import serves_https
from backend.environ_config import env, env_bool, env_int, env_list

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env("DEFL_DATA_DIR", str(BASE_DIR / "var" / "node"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env("DJANGO_SECRET_KEY", "")
DEBUG = env_bool("DJANGO_DEBUG", False)
if not SECRET_KEY:
    # The development key is public: sessions, CSRF tokens and password-reset links signed with
    # it can be forged by anyone. Only a DEBUG node, or one told explicitly, may use it.
    if not DEBUG and not env_bool("DEFL_ALLOW_INSECURE_SECRET", False):
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set: a node with DJANGO_DEBUG off refuses to start without "
            "its own secret key (set DJANGO_SECRET_KEY to a long random string, e.g. the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`)."
        )
    SECRET_KEY = "defl-insecure-development-key-set-DJANGO_SECRET_KEY"
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "backend.nodes.admin_site.NodeAdminConfig",  # django.contrib.admin, its login throttled
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served by the node itself (no CDN)
    "backend.nodes",
    "backend.ledger",
    "backend.swarm",
    "backend.datasets",
    "backend.jobs",
    "backend.serving",
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
]

ROOT_URLCONF = "backend.urls"
WSGI_APPLICATION = "backend.wsgi.application"

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
            ]
        },
    }
]

# Connections persist for a minute; each is pinged before its first use in a request, a task
# or an agent tick (CONN_HEALTH_CHECKS), so a database server restarted under the node costs
# one reconnect, not a failed request or action on a connection the server has closed.
DATABASES = {
    "default": dj_database_url.parse(
        env("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}"), conn_max_age=60, conn_health_checks=True
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A node's web, agent and worker processes share the file: WAL lets readers run beside the
    # writer, and writers wait for the lock (IMMEDIATE transactions) instead of failing at once.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns on every request when it is missing

# --- API security: tokens, login throttle and lockout, uploads (backend/api, backend/nodes) ---
# An API token (and a dashboard session) is valid this many seconds after login; then 401.
DEFL_TOKEN_TTL_S = env_int("DEFL_TOKEN_TTL_S", 12 * 3600)
SESSION_COOKIE_AGE = DEFL_TOKEN_TTL_S
# Login attempts a client address, and attempts one username, may make (DRF rate: n/s|min|hour).
DEFL_LOGIN_RATE_PER_IP = env("DEFL_LOGIN_RATE_PER_IP", "30/min")
DEFL_LOGIN_RATE_PER_USER = env("DEFL_LOGIN_RATE_PER_USER", "10/min")
# After this many failed logins for one username (or from one address) in a row, logins for it
# are refused (429 with Retry-After) for DEFL_LOGIN_LOCKOUT_S seconds.
DEFL_LOGIN_LOCKOUT_FAILURES = env_int("DEFL_LOGIN_LOCKOUT_FAILURES", 5)
DEFL_LOGIN_LOCKOUT_S = env_int("DEFL_LOGIN_LOCKOUT_S", 15 * 60)
# Reverse proxies in front of the node: 0 means the client address is the TCP peer's, so a
# client cannot pick its own throttle identity with an X-Forwarded-For header.
DEFL_NUM_PROXIES = env_int("DEFL_NUM_PROXIES", 0)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "backend.nodes.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "backend.api.schema.NodeAutoSchema",
    "EXCEPTION_HANDLER": "backend.api.exception_handler.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"login_ip": DEFL_LOGIN_RATE_PER_IP, "login_user": DEFL_LOGIN_RATE_PER_USER},
    "NUM_PROXIES": DEFL_NUM_PROXIES,
    # Bodies are JSON; the views that take files say so (datasets, swarm blobs), so the schema
    # states each operation's one media type and another is a 415.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

# Throttle counters, login lockouts (and anything else a node's processes must agree on) live in
# a cache all of them share: the node's database by default (table created by a migration of
# backend.nodes), or Redis when DEFL_CACHE_URL is set (redis://...).
DEFL_CACHE_URL = env("DEFL_CACHE_URL", "")
CACHES: dict[str, dict[str, Any]] = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": DEFL_CACHE_URL}
        if DEFL_CACHE_URL
        else {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "defl_cache",
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        }
    )
}
SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "DeFL node API",
    "DESCRIPTION": "Decentralized federated learning: datasets, jobs, rounds, models.",
    "VERSION": "0.1.0",
    # /api/docs/ loads Swagger UI from this node's static files: it works on a node without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery: Redis when a broker is configured, otherwise tasks run in-process.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# --- Ledger: the chain this node uses (backend/ledger reads these through its factory) ---
# Empty DEFL_CHAIN_URL: web3's in-process EVM (eth-tester), for a single process.
DEFL_CHAIN_URL = env("DEFL_CHAIN_URL", "")
# The node key: a hex private key from the environment, or an encrypted keystore file + password.
DEFL_NODE_KEY = env("DEFL_NODE_KEY", "")
DEFL_KEYSTORE_PATH = env("DEFL_KEYSTORE_PATH", str(DATA_DIR / "keystore.json"))
DEFL_KEYSTORE_PASSWORD = env("DEFL_KEYSTORE_PASSWORD", "")
DEFL_CONTRACTS_FILE = env("DEFL_CONTRACTS_FILE", str(DATA_DIR / "contracts.json"))
# Blocks the event indexer stays behind the chain's head; unset: the chain's kind decides
# (backend/ledger/chains.py default_confirmations: 0 on a development chain that mines at once,
# a block on a consortium chain of validators, whose forks are resolved within a block).
DEFL_CONFIRMATIONS: int | None = env_int("DEFL_CONFIRMATIONS", 0) if env("DEFL_CONFIRMATIONS", "") else None
# The hardfork the contracts are compiled for when `manage.py ledger deploy` deploys them:
# cancun, shanghai or london (a chain before shanghai, e.g. a Clique consortium, runs london).
DEFL_EVM_VERSION = env("DEFL_EVM_VERSION", "cancun")
# Lock files that keep the nonces of this node's processes apart; the admission vote threshold
# (percent of members) used by `manage.py ledger deploy`; the indexer's polling interval.
DEFL_LEDGER_LOCK_DIR = env("DEFL_LEDGER_LOCK_DIR", str(DATA_DIR / "locks"))
DEFL_ADMISSION_THRESHOLD_PCT = env_int("DEFL_ADMISSION_THRESHOLD_PCT", 51)
DEFL_INDEXER_INTERVAL = float(env("DEFL_INDEXER_INTERVAL", "2.0"))

# --- Swarm store: this node's chunk directory and replication ---
DEFL_CHUNK_DIR = env("DEFL_CHUNK_DIR", str(DATA_DIR / "chunks"))
DEFL_REPLICATION = env_int("DEFL_REPLICATION", 3)
# Static peers until the ledger's node registry supplies them.
DEFL_PEERS = env_list("DEFL_PEERS", [])
# DEFL_PEERS entries are <chain address>@<base URL>, e.g. 0xAb..@http://127.0.0.1:8101 (see
# backend/swarm/peers.py); every node may get the same list, a node recognises itself by its key.
# Acknowledged copies an upload needs per chunk (0: the replication factor R).
DEFL_SWARM_MIN_REPLICAS = env_int("DEFL_SWARM_MIN_REPLICAS", 0)
# Accept a peer request whose timestamp is at most this far from our clock (nonces kept twice as long).
DEFL_SWARM_CLOCK_SKEW_S = env_int("DEFL_SWARM_CLOCK_SKEW_S", 60)
# fsync every chunk file and directory (atomic + durable); off only for throwaway test stores.
DEFL_SWARM_FSYNC = env_bool("DEFL_SWARM_FSYNC", True)
# Seconds between a node's scheduled repairs of every chunk it holds (its agent runs them; 0: off),
# so a storage node lost for good is made up for without anyone asking (backend/swarm/repair_schedule.py).
DEFL_SWARM_REPAIR_INTERVAL_S = env_int("DEFL_SWARM_REPAIR_INTERVAL_S", 900)
DEFL_SWARM_TIMEOUT_S = env_int("DEFL_SWARM_TIMEOUT_S", 30)
# Largest peer request body (a push batch) a node reads.
DEFL_SWARM_MAX_BATCH_BYTES = env_int("DEFL_SWARM_MAX_BATCH_BYTES", 64 << 20)
# Hostile peers and members (backend/swarm, README "Swarm store: limits"): the largest blob a read
# accepts when the caller knows no better bound; per-peer requests and pushed bytes per minute
# (429 beyond); seconds a peer body may take beyond 1 MB/s; bytes this node's users may pin;
# whether registered endpoints may be loopback / private / link-local (the local federation).
DEFL_SWARM_MAX_BLOB_BYTES = env_int("DEFL_SWARM_MAX_BLOB_BYTES", 4 << 30)
DEFL_SWARM_PEER_REQUESTS_PER_MIN = env_int("DEFL_SWARM_PEER_REQUESTS_PER_MIN", 6000)
DEFL_SWARM_PEER_BYTES_PER_MIN = env_int("DEFL_SWARM_PEER_BYTES_PER_MIN", 16 << 30)
DEFL_SWARM_BODY_TIMEOUT_S = env_int("DEFL_SWARM_BODY_TIMEOUT_S", 10)
DEFL_SWARM_PIN_QUOTA_BYTES = env_int("DEFL_SWARM_PIN_QUOTA_BYTES", 10 << 30)
DEFL_ALLOW_PRIVATE_PEERS = env_bool("DEFL_ALLOW_PRIVATE_PEERS", False)

# --- Accounts, node identity API, datasets, serving (backend/nodes, datasets, serving, api) ---
# Largest upload (a dataset, a blob) accepted. Every multipart upload is kept in memory and
# refused (413) as soon as it passes the limit: no plaintext ever reaches a temp file.
DEFL_MAX_UPLOAD_BYTES = env_int("DEFL_MAX_UPLOAD_BYTES", 128 * 1024 * 1024)
FILE_UPLOAD_HANDLERS = ["backend.api.uploads.BoundedMemoryUploadHandler"]
# Largest size a compressed dataset (.npz) may unpack to: a small upload must not inflate into
# gigabytes (a compressed bomb). Checked from the archive's directory before anything unpacks.
DEFL_MAX_DATASET_BYTES = env_int("DEFL_MAX_DATASET_BYTES", 1024 * 1024 * 1024)
# Largest JSON or form body (not a file upload) an endpoint reads, before it reads it (413 beyond;
# Django's default). The anonymous login takes 16 KiB at most.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DEFL_MAX_REQUEST_BYTES", 2621440)
# How this node presents itself on chain (NodeRegistry.registerNode) and in GET /api/node.
DEFL_NODE_NAME = env("DEFL_NODE_NAME", "defl-node")
DEFL_NODE_ENDPOINT = env("DEFL_NODE_ENDPOINT", "http://127.0.0.1:8000")
# Browser security (backend/api/security.py): a node whose endpoint is https:// (DEBUG off) sends
# its session and CSRF cookies over HTTPS only and HSTS for a year; the loopback development
# setup (http) keeps plain cookies. Every answer carries a Content-Security-Policy; JSON is gzipped.
DEFL_SERVES_HTTPS = serves_https(DEFL_NODE_ENDPOINT, DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = DEFL_SERVES_HTTPS
SECURE_HSTS_SECONDS = 365 * 24 * 3600 if DEFL_SERVES_HTTPS else 0
if DEFL_NUM_PROXIES:  # a TLS-terminating proxy names the scheme; trusted only when declared
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
    "backend.api.compression.JsonGZipMiddleware",
)
MIDDLEWARE.append("backend.api.security.ContentSecurityPolicyMiddleware")
CSRF_FAILURE_VIEW = "backend.api.fallback.csrf_failure"  # JSON on /api/ paths, Django's page elsewhere
# The schema states every error status and bounds record ids in paths (backend/api/schema.py);
# a request's shape apart from its answer's (an uploaded file is binary, not a URL).
SPECTACULAR_SETTINGS["COMPONENT_SPLIT_REQUEST"] = True
SPECTACULAR_SETTINGS.setdefault("ENUM_NAME_OVERRIDES", {})["ApiTokenKindEnum"] = (
    "backend.nodes.models.ApiToken.Kind"
)
SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"] = [
    "drf_spectacular.hooks.postprocess_schema_enums",
    "backend.api.schema.bounded_path_ids",
]

# --- Jobs: the round driver (backend/jobs) ---
# Seconds between the agent's full ticks when no block comes: a new block triggers one at once
# (DEFL_AGENT_POLL, or a newHeads subscription), so this paces only deadlines, retries and job
# discovery. Shorter costs every idle node a planning pass each time, on the CPU trainers use.
DEFL_AGENT_INTERVAL = float(env("DEFL_AGENT_INTERVAL", "2.0"))
# Seconds between the agent's cheap checks of the chain head: a new block triggers a tick at once.
DEFL_AGENT_POLL = float(env("DEFL_AGENT_POLL", "0.05"))
# Test hook only: this node's trainer attacks (an fl_node.attacks name, e.g. label_flip).
DEFL_ATTACK = env("DEFL_ATTACK", "")
# Test hook only: while a file exists at this path, this node, as the first seat of a new
# committee, holds its vote (tests/faults kill a proposer that has not proposed yet).
DEFL_HOLD_PROPOSALS_FILE = env("DEFL_HOLD_PROPOSALS_FILE", "")
# A committee member in seat s proposes the global model after s times this many seconds.
DEFL_PROPOSER_FALLBACK_S = float(env("DEFL_PROPOSER_FALLBACK_S", "20"))
# How long a claimed round action blocks a repeat, and the pause before a failed one is retried.
DEFL_ACTION_LEASE_S = float(env("DEFL_ACTION_LEASE_S", "600"))
DEFL_ACTION_RETRY_S = float(env("DEFL_ACTION_RETRY_S", "5"))
# Trainers start the next round on their own (deterministic) aggregate as soon as a round is
# finalized, and submit only once the committee fixed the same model on chain.
DEFL_SPECULATIVE_TRAINING = env_bool("DEFL_SPECULATIVE_TRAINING", True)
DEFL_SPECULATION_WAIT_S = float(env("DEFL_SPECULATION_WAIT_S", "30"))
# Local training runs on a thread with this niceness (Linux), so the node's other work (agent
# ticks, scoring, the API and the peer API) does not queue behind it. 0: same priority.
DEFL_TRAIN_NICE = env_int("DEFL_TRAIN_NICE", 10)
# This node's limits on a job proposed by another member (backend/jobs/remote_config.py): a job
# whose config exceeds one, or contradicts its on-chain spec, is declined with the reason logged.
DEFL_MAX_MODEL_PARAMS = env_int("DEFL_MAX_MODEL_PARAMS", 50_000_000)  # parameters + buffers
DEFL_MAX_BATCH_SIZE = env_int("DEFL_MAX_BATCH_SIZE", 4096)
DEFL_MAX_LOCAL_EPOCHS = env_int("DEFL_MAX_LOCAL_EPOCHS", 100)
DEFL_MAX_ROUNDS = env_int("DEFL_MAX_ROUNDS", 1000)
DEFL_MAX_JOB_PERIOD_S = env_int("DEFL_MAX_JOB_PERIOD_S", 7 * 24 * 3600)  # round, scoring, joining

# --- Dashboard (backend/web): the built Vue app, served by this node through WhiteNoise ---
INSTALLED_APPS += ["backend.web"]
DEFL_FRONTEND_DIST = BASE_DIR / "frontend" / "dist"
# `npm --prefix frontend run build` writes the SPA there; its assets are served under STATIC_URL
# straight from the build (no collectstatic step), its index.html by backend.web for client routes.
STATICFILES_DIRS = [DEFL_FRONTEND_DIST] if DEFL_FRONTEND_DIST.is_dir() else []
WHITENOISE_USE_FINDERS = True
# Vite's assets carry a content hash in their name: cache them forever.
WHITENOISE_IMMUTABLE_FILE_TEST = r"^/static/assets/.+-[0-9A-Za-z_-]{8}\.\w+$"

# --- Cluster (backend/cluster): workers, their device slots, local tasks (README "Cluster") ---
INSTALLED_APPS += ["backend.cluster"]
# CPU cores a worker lends to tasks (0: the cores this process may run on); GPUs torch sees.
DEFL_CLUSTER_CPU_CORES = env_int("DEFL_CLUSTER_CPU_CORES", 0)
DEFL_CLUSTER_USE_GPU = env_bool("DEFL_CLUSTER_USE_GPU", True)
# Heartbeat period; a worker silent for the timeout gets no new task.
DEFL_CLUSTER_HEARTBEAT_S = float(env("DEFL_CLUSTER_HEARTBEAT_S", "10"))
DEFL_CLUSTER_WORKER_TIMEOUT_S = float(env("DEFL_CLUSTER_WORKER_TIMEOUT_S", "60"))
# Attempts of a local task, and the back-off before attempt n+1: base * 2^(n-1) seconds (cap 300).
DEFL_CLUSTER_MAX_ATTEMPTS = env_int("DEFL_CLUSTER_MAX_ATTEMPTS", 3)
DEFL_CLUSTER_RETRY_BASE_S = float(env("DEFL_CLUSTER_RETRY_BASE_S", "2"))
# The cluster's "kind" and "state" choices get names of their own in the OpenAPI schema.
SPECTACULAR_SETTINGS.setdefault("ENUM_NAME_OVERRIDES", {}).update(
    {
        "SlotKindEnum": "backend.cluster.models.DeviceSlot.Kind",
        "TaskKindEnum": "backend.cluster.models.Task.Kind",
        "TaskStateEnum": "backend.cluster.models.Task.State",
        "WorkerStateEnum": "backend.cluster.models.Worker.State",
    }
)

# --- Operations (backend/monitoring, docs/OPERATIONS.md): metrics, health, logs ---
# GET /metrics answers a scraper presenting `Authorization: Bearer <DEFL_METRICS_TOKEN>` (when set),
# or one whose address is in DEFL_METRICS_ALLOWED_NETS (CIDRs; loopback by default); others get 403.
DEFL_METRICS_TOKEN = env("DEFL_METRICS_TOKEN", "")
DEFL_METRICS_ALLOWED_NETS = env_list("DEFL_METRICS_ALLOWED_NETS", ["127.0.0.1/32", "::1/128"])
# Where this node's processes (web, agent, worker) keep their counters for the scrape to sum: the
# client library's multiprocess mode, chosen before anything imports it, one directory per node.
DEFL_METRICS_DIR = Path(env("DEFL_METRICS_DIR", str(DATA_DIR / "metrics")))
DEFL_METRICS_DIR.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(DEFL_METRICS_DIR)
MIDDLEWARE.insert(0, "backend.monitoring.middleware.RequestMetricsMiddleware")
# Logs: "text" (one line each) or "json" (one JSON object per line); both name the node, and the
# job, round and action a line belongs to. DEFL_LOG_LEVEL: DEBUG, INFO, WARNING (default), ERROR.
DEFL_LOG_FORMAT = env("DEFL_LOG_FORMAT", "text")
DEFL_LOG_LEVEL = env("DEFL_LOG_LEVEL", "WARNING").upper()
from backend.telemetry.logs import logging_config  # noqa: E402 (needs the two settings above)

LOGGING = logging_config(DEFL_LOG_FORMAT, DEFL_LOG_LEVEL)
