"""Private MariaDB and Redis servers that a fault test may stop and start under a node.

The machine's shared MariaDB (3306) and Redis (6379) serve every other test at the same time:
a test that restarts one must own it. Each server here runs on a free port with its own data
directory (MariaDB) or none (Redis, ``--save ""``), is started and stopped by this process only
(by its own pid), and ``restart`` brings it back on the same port with the same data, as an
operator's ``systemctl restart`` would: every client connection is cut, nothing is lost.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from devnet.anvil import free_port
from devnet.process import stop_process

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
# Small InnoDB files: the data directory is 26 MB instead of 114, and installs in seconds.
INNODB = ["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M"]


def available() -> str:
    """Why these servers cannot run here ('' when they can)."""
    missing = [p for p in (MARIADBD, INSTALL_DB, REDIS_SERVER) if not Path(p).exists()]
    return f"not installed: {', '.join(missing)}" if missing else ""


def _wait_port(port: int, process: subprocess.Popen, log: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited ({process.returncode}); see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"server on port {port} not listening within {wait_s:.0f}s; see {log}")


class _Server:
    name = "server"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log = self.root / f"{self.name}.log"
        self.restarts: list[float] = []  # seconds each restart took (stop + start, until listening)

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, wait_s: float = 60) -> None:
        log = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(self.argv(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        _wait_port(self.port, self.process, self.log, wait_s)
        self._ready(wait_s)

    def _ready(self, wait_s: float) -> None:
        """Listening is not serving: wait until a client's first command succeeds."""

    def stop(self, timeout_s: float = 30) -> None:
        """A clean shutdown (SIGTERM): the server closes every client connection and exits."""
        stop_process(self.process, timeout_s=timeout_s)
        self.process = None

    def restart(self, down_s: float = 1.0) -> float:
        """Stop, stay down ``down_s`` (clients fail meanwhile), start again on the same port."""
        began = time.monotonic()
        self.stop()
        time.sleep(down_s)
        self.start()
        took = time.monotonic() - began
        self.restarts.append(took)
        return took

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PrivateMariaDB(_Server):
    """A mariadbd of this test's own: its data directory, port and socket; any user, no password
    (``--skip-grant-tables``: nothing but this test can reach a loopback port it picked)."""

    name = "mariadb"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.datadir = self.root / "data"

    @property
    def url(self) -> str:
        return f"mysql://root:@127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            MARIADBD,
            "--no-defaults",  # not the machine's /etc/mysql: its port, socket and datadir are the shared server's
            f"--datadir={self.datadir}",
            f"--socket={self.root / 'mariadb.sock'}",
            f"--pid-file={self.root / 'mariadb.pid'}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            "--user=root",
            "--skip-name-resolve",
            "--skip-grant-tables",
            "--skip-log-bin",
            *INNODB,
        ]

    def start(self, wait_s: float = 60) -> None:
        if not (self.datadir / "mysql").exists():
            subprocess.run(
                [
                    INSTALL_DB,
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    *INNODB,
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        super().start(wait_s)

    def _ready(self, wait_s: float) -> None:
        import MySQLdb

        deadline = time.monotonic() + wait_s
        while True:
            try:
                MySQLdb.connect(host="127.0.0.1", port=self.port, user="root", passwd="").close()
                return
            except MySQLdb.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def query(self, database: str, sql: str, *params) -> list[tuple]:
        import MySQLdb

        connection = MySQLdb.connect(host="127.0.0.1", port=self.port, user="root", passwd="", db=database)
        try:
            cursor = connection.cursor()
            cursor.execute(sql, params or None)
            return list(cursor.fetchall())
        finally:
            connection.close()


class PrivateRedis(_Server):
    """A redis-server of this test's own, in memory only: a restart loses every queued message
    (as a broker without persistence does), which is the harder case for the node."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.root),
        ]  # fmt: skip

    def _ready(self, wait_s: float) -> None:
        import redis

        deadline = time.monotonic() + wait_s
        while True:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=1).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
