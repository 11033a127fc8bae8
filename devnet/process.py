"""Start and stop local node processes (gunicorn) for tests, benchmarks and demos.

Each node gets its own data directory (SQLite database, chunk store), key, port and
environment; ``NodeProcess`` owns exactly the process it started and stops only that.

    nodes = [NodeProcess(tmp / f"n{i}") for i in range(4)]
    prepare_nodes(nodes, replication=3)     # same DEFL_PEERS for all, databases migrated
    for node in nodes:
        node.start()
    ...
    node.stop()                             # or node.kill(); start() again keeps the data
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests
from eth_account import Account

from devnet.anvil import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def schema_template() -> Path:
    """Where a freshly migrated SQLite database of this checkout's migrations is kept: named by a hash
    of every migration file and Django's version, so a changed migration makes a new one. It lives in
    the checkout's own ``var/`` (ignored by git, removed by ``make clean``), not in a shared temporary
    directory, where another user of the machine could leave a schema with accounts of their own.
    Hashed once a process: the migrations do not change under a running harness."""
    digest = hashlib.sha256(importlib.metadata.version("django").encode())
    for path in sorted((REPO_ROOT / "backend").glob("*/migrations/*.py")):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    folder = REPO_ROOT / "var" / "schemas"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{digest.hexdigest()[:32]}.sqlite3"


class ManageError(subprocess.CalledProcessError):
    """A manage.py command that failed, shown with the end of what it said (a bare exit status
    hid why a federation did not come up)."""

    def __str__(self) -> str:
        said = (self.stderr or self.stdout or "").strip()[-1500:]
        return f"{super().__str__()}\n{said}"


class NodeProcess:
    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int | None = None,
        private_key: str | None = None,
        env: Mapping[str, str] | None = None,
        threads: int = 8,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.private_key = private_key or Account.create().key.hex()
        self.address = Account.from_key(self.private_key).address
        self.extra_env = dict(env or {})
        # Its own random secret (sessions, CSRF), the same for all of its processes, new each run.
        self.secret_key = secrets.token_urlsafe(50)
        self.threads = threads
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def chunk_dir(self) -> Path:
        return self.data_dir / "chunks"

    @property
    def peer_entry(self) -> str:
        """This node as a DEFL_PEERS entry."""
        return f"{self.address}@{self.url}"

    def environ(self) -> dict[str, str]:
        """The environment of this node's processes (server and management commands)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEFL_", "DATABASE_URL"))}
        env.update(
            DJANGO_SETTINGS_MODULE="backend.settings",
            DEFL_DATA_DIR=str(self.data_dir),
            DEFL_NODE_KEY=self.private_key,
            DJANGO_SECRET_KEY=self.secret_key,
            DEFL_CHUNK_DIR=str(self.chunk_dir),
            DATABASE_URL=f"sqlite:///{self.data_dir / 'db.sqlite3'}",
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def manage(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run ``manage.py ARGS`` as this node; with ``check``, a failure raises ManageError."""
        done = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *args],
            cwd=REPO_ROOT,
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise ManageError(done.returncode, done.args, done.stdout, done.stderr)
        return done

    def migrate(self) -> None:
        """This node's database migrated. A new SQLite database is a copy of this checkout's migrated
        schema (:func:`schema_template`), made by the first node that needs it: migrating costs
        seconds a node, and no migration writes node-specific rows."""
        database = self.data_dir / "db.sqlite3"
        if self.environ()["DATABASE_URL"] == f"sqlite:///{database}" and not database.exists():
            template = schema_template()
            if template.exists():
                shutil.copyfile(template, database)
                return
            self._migrate()
            partial = template.with_name(f"{template.name}.{secrets.token_hex(8)}")
            shutil.copyfile(database, partial)
            os.replace(partial, template)  # atomic: another process never reads half a schema
            return
        self._migrate()

    def _migrate(self) -> None:
        # --skip-checks: the checks import every view (and torch), seconds a call; `check` covers them.
        self.manage("migrate", "--noinput", "--skip-checks")

    def api_token(self, username: str = "tester") -> str:
        """Create a user in this node's database and return a new API token (a script's) for it."""
        code = (
            "from django.contrib.auth import get_user_model; from backend.nodes.accounts import api_token; "
            f"u, _ = get_user_model().objects.get_or_create(username={username!r}); "
            "print(api_token(u, 'devnet'))"
        )
        return self.manage("shell", "-c", code).stdout.strip().splitlines()[-1]

    def start(self, *, wait: bool = True, wait_s: float = 60) -> None:
        """Launch the server; with ``wait`` return once it answers /api/health."""
        if self.running:
            return
        log = open(self.data_dir / "server.log", "ab")  # noqa: SIM115 - owned by the process
        command = [
            sys.executable, "-m", "gunicorn", "backend.wsgi",
            "-k", "gthread", "--threads", str(self.threads), "-b", f"127.0.0.1:{self.port}",
            "--timeout", "300", "--graceful-timeout", "3", "--log-level", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=self.environ(), stdout=log, stderr=log)
        log.close()
        if wait:
            self.wait_ready(wait_s)

    def wait_ready(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"node on port {self.port} exited; see {self.data_dir / 'server.log'}")
            try:
                if requests.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"node on port {self.port} did not answer within {wait_s}s")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, timeout_s: float = 10) -> None:
        """Graceful stop (SIGTERM), then SIGKILL if it does not exit in time."""
        stop_process(self.process, timeout_s=timeout_s)
        self.process = None

    def kill(self) -> None:
        """Hard stop, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> NodeProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(process: subprocess.Popen | None, *, timeout_s: float = 10) -> None:
    """Stop a process this one started (by its own handle): SIGTERM, then SIGKILL after ``timeout_s``."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def prepare_nodes(
    nodes: Sequence[NodeProcess], *, users: Sequence[str] = (), **settings: str | int
) -> dict[str, str]:
    """Give every node the same peer list and settings, and a migrated database.

    Settings are given without the DEFL_ prefix (``replication=3`` sets DEFL_REPLICATION).
    Migrating takes ~10 s, so the first node's fresh database is copied to the others:
    the schema is the same and no migration writes node-specific rows. ``users`` are
    created before the copy, so each has the same API token on every node; returns
    {username: token}.
    """
    peers = ",".join(n.peer_entry for n in nodes)
    for node in nodes:
        node.extra_env.setdefault("DEFL_PEERS", peers)
        for name, value in settings.items():
            node.extra_env.setdefault(f"DEFL_{name.upper()}", str(value))
    template = nodes[0].data_dir / "db.sqlite3"
    tokens: dict[str, str] = {}
    if not template.exists():
        nodes[0].migrate()
    for user in users:
        tokens[user] = nodes[0].api_token(user)
    for node in nodes[1:]:
        target = node.data_dir / "db.sqlite3"
        if not target.exists():
            shutil.copyfile(template, target)
    return tokens


def start_all(nodes: Sequence[NodeProcess], *, wait_s: float = 60) -> None:
    """Launch every node, then wait for all: the imports of several nodes overlap."""
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready(wait_s)


def stop_all(nodes: Sequence[NodeProcess], *, timeout_s: float = 10) -> None:
    """Ask every node to stop at once, then wait for each (SIGKILL after ``timeout_s``)."""
    for node in nodes:
        if node.running and node.process is not None:
            node.process.send_signal(signal.SIGTERM)
    for node in nodes:
        node.stop(timeout_s=timeout_s)
