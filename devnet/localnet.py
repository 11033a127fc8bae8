"""A local federation on one machine: an anvil chain, the contracts, and N node processes.

Each node is what an organization runs (web server + agent, plus a Celery worker when it
has a broker), with its own database, chunk directory and key; the nodes meet only on the
chain and in the swarm store they form. ``make demo`` runs this module; the end-to-end
tests and the round benchmarks drive the same class.

This orchestrator stays outside Django: it starts processes and talks to them the way an
operator would, through ``manage.py`` and the REST API.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

from devnet.anvil import AnvilProcess
from devnet.process import REPO_ROOT, NodeProcess

OPERATOR = "operator"
TERMINAL = {"finished", "failed", "cancelled"}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    database: str = "sqlite"  # or "mariadb" (MariaDB/MySQL on MARIADB_URL)
    celery: bool = False  # a Celery worker on Redis runs this node's round actions
    attack: str = ""  # test hook: this node's trainer attacks (fl_node.attacks)
    # test hook: RLIMIT_AS of this node's agent and worker (a victim of memory bombs); None: none
    memory_limit_bytes: int | None = None


@dataclass
class LocalNode:
    spec: NodeSpec
    web: NodeProcess
    token: str = ""
    agent: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    database_name: str = ""
    redis_db: int | None = None

    @property
    def url(self) -> str:
        return self.web.url

    @property
    def address(self) -> str:
        return self.web.address

    def api(self) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {self.token}"
        return session

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.web.data_dir / log_name, "ab")  # noqa: SIM115 - owned by the child
        env, limit = self.web.environ(), self.spec.memory_limit_bytes
        if limit is not None:
            env.setdefault("MALLOC_ARENA_MAX", "2")  # per-thread arenas would spend the address space
        try:
            return subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=log,
                preexec_fn=None if limit is None else _address_space_limit(limit),
            )
        finally:
            log.close()

    def start_agent(self) -> None:
        self.agent = self._spawn([sys.executable, "manage.py", "node", "run"], "agent.log")

    def start_worker(self) -> None:
        argv = [sys.executable, "-m", "celery", "-A", "backend", "worker", "--pool", "solo", "-l", "warning"]
        self.worker = self._spawn(argv, "worker.log")

    def stop(self) -> None:
        for process in (self.agent, self.worker):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (self.agent, self.worker):
            if process is not None:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.agent = self.worker = None
        self.web.stop()


@dataclass
class LocalFederation:
    root: Path
    specs: Sequence[NodeSpec]
    mariadb_url: str = "mysql://root:@127.0.0.1:3306"
    redis_url: str = "redis://127.0.0.1:6379"
    agent_interval: float | None = None  # DEFL_AGENT_INTERVAL of the nodes; None: the settings' default
    # A development harness: its contracts accept committees of 1, 2 or an even size (a production
    # deployment refuses them: FederatedLearning.allowSmallCommittees).
    allow_small_committees: bool = True
    password: str = field(
        default_factory=lambda: os.environ.get("DEFL_DEMO_PASSWORD") or secrets.token_urlsafe(9)
    )
    log: Callable[[str], None] = print
    anvil: AnvilProcess | None = None
    nodes: list[LocalNode] = field(default_factory=list)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalFederation:
        self.root = Path(self.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.anvil = AnvilProcess().start()
        self.log(f"chain: anvil at {self.anvil.url}")
        contracts = self.root / "contracts.json"
        for i, spec in enumerate(self.specs):
            web = NodeProcess(self.root / spec.name, env=self._node_env(spec, contracts))
            web.extra_env["DEFL_NODE_ENDPOINT"] = web.url
            self.nodes.append(LocalNode(spec, web))
            self._prepare_database(self.nodes[-1], i)
        first = self.nodes[0]
        first.web.manage(
            "ledger", "deploy", *(["--allow-small-committees"] if self.allow_small_committees else [])
        )
        small = ", development flag: small committees allowed" if self.allow_small_committees else ""
        self.log(f"contracts deployed ({contracts}{small})")
        for i, node in enumerate(self.nodes):
            node.web.manage("node", "init")
            for voter in self.nodes[:i]:  # the members vote the applicant in
                voter.web.manage("node", "admit", node.address)
            out = node.web.manage(
                "node", "adduser", OPERATOR, "--role", "operator", "--password-env", "DEFL_DEMO_PASSWORD"
            ).stdout
            node.token = out.rsplit("API token:", 1)[1].strip()
            self.log(f"node {node.spec.name}: {node.address} registered")
        for node in self.nodes:
            node.web.start(wait=False)
        for node in self.nodes:
            node.web.wait_ready(120)
            node.start_agent()
            if node.spec.celery:
                node.start_worker()
        self.log("nodes up: " + ", ".join(f"{n.spec.name} {n.url}" for n in self.nodes))
        return self

    def stop(self) -> None:
        # Every node at once: each takes seconds to wind down (its agent ends its tick, its web
        # server its requests); one after another that was half a minute for four nodes.
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            list(pool.map(LocalNode.stop, self.nodes))
        for node in self.nodes:
            if node.database_name:
                _mariadb_execute(self.mariadb_url, f"DROP DATABASE IF EXISTS `{node.database_name}`")
        if self.anvil is not None:
            self.anvil.stop()

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _node_env(self, spec: NodeSpec, contracts: Path) -> dict[str, str]:
        assert self.anvil is not None
        env = {
            "DEFL_CHAIN_URL": self.anvil.url,
            "DEFL_CONTRACTS_FILE": str(contracts),
            "DEFL_NODE_NAME": spec.name,
            "DEFL_DEMO_PASSWORD": self.password,
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DEFL_ALLOW_PRIVATE_PEERS": "1",  # the members' endpoints are on loopback
        }
        if self.agent_interval is not None:
            env["DEFL_AGENT_INTERVAL"] = env["DEFL_INDEXER_INTERVAL"] = str(self.agent_interval)
        if spec.attack:
            env["DEFL_ATTACK"] = spec.attack
        return env

    def _prepare_database(self, node: LocalNode, index: int) -> None:
        if node.spec.database == "mariadb":
            node.database_name = f"defl_{node.spec.name}_{uuid.uuid4().hex[:8]}"
            _mariadb_execute(
                self.mariadb_url, f"CREATE DATABASE `{node.database_name}` CHARACTER SET utf8mb4"
            )
            node.web.extra_env["DATABASE_URL"] = f"{self.mariadb_url}/{node.database_name}"
            node.web.migrate()
        else:
            # Migrating costs ~10 s a node: the first fresh SQLite schema is copied to the others.
            template = self.root / "template.sqlite3"
            if not template.exists():
                node.web.migrate()
                shutil.copyfile(node.web.data_dir / "db.sqlite3", template)
            else:
                shutil.copyfile(template, node.web.data_dir / "db.sqlite3")
        if node.spec.celery:
            node.redis_db = 8 + index
            broker = f"{self.redis_url}/{node.redis_db}"
            _redis_flush(broker)  # no task of an earlier run may reach this node's worker
            node.web.extra_env["CELERY_BROKER_URL"] = broker

    # ------------------------------------------------------------------ the REST API, as an operator

    def upload_dataset(
        self,
        node: LocalNode,
        x: np.ndarray,
        y: np.ndarray,
        *,
        name: str,
        classes: Sequence[int],
        epsilon_cap: float,
        delta: float = 1e-5,
    ) -> dict:
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        data = {
            "name": name,
            "format": "npz",
            "epsilon_cap": epsilon_cap,
            "delta": delta,
            "classes": ",".join(str(c) for c in classes),
        }
        files = {"file": (f"{name}.npz", buffer.getvalue(), "application/octet-stream")}
        response = node.api().post(f"{node.url}/api/datasets", data=data, files=files, timeout=120)
        _raise_for(response)
        return response.json()

    def create_job(self, node: LocalNode, payload: dict) -> dict:
        response = node.api().post(f"{node.url}/api/jobs", json=payload, timeout=120)
        _raise_for(response)
        return response.json()

    def join(self, node: LocalNode, job_id: int, dataset_id: int, *, wait_s: float = 60) -> dict:
        """Join once this node has indexed the job (a node learns of jobs from the chain)."""
        deadline = time.monotonic() + wait_s
        while True:
            response = node.api().post(
                f"{node.url}/api/jobs/{job_id}/join", json={"dataset": dataset_id}, timeout=120
            )
            if response.status_code != 404 or time.monotonic() > deadline:
                _raise_for(response)
                return response.json()
            time.sleep(0.5)

    def wait_prepared(self, job_id: int, *, timeout_s: float = 120) -> bool:
        """Wait until every node reports the job's first round prepared (the jobs API's ``joined.prepared``).

        As an operator would before pressing start: otherwise round 1 also pays for the last
        joiner loading its data and calibrating its noise. False if some node was not ready in time.
        """
        deadline = time.monotonic() + timeout_s
        waiting = list(self.nodes)
        while waiting and time.monotonic() < deadline:
            waiting = [n for n in waiting if not (self.job(n, job_id).get("joined") or {}).get("prepared")]
            if waiting:
                time.sleep(0.25)
        return not waiting

    def start_job(self, node: LocalNode, job_id: int) -> dict:
        response = node.api().post(f"{node.url}/api/jobs/{job_id}/start", json={}, timeout=120)
        _raise_for(response)
        return response.json()

    def job(self, node: LocalNode, job_id: int) -> dict:
        response = node.api().get(f"{node.url}/api/jobs/{job_id}", timeout=30)
        _raise_for(response)
        return response.json()

    def rounds(self, node: LocalNode, job_id: int) -> list[dict]:
        response = node.api().get(f"{node.url}/api/jobs/{job_id}/rounds", timeout=30)
        _raise_for(response)
        return response.json()

    def wait_for_job(
        self,
        job_id: int,
        *,
        timeout_s: float = 1800,
        on_progress: Callable[[dict, list[dict]], None] | None = None,
    ) -> dict:
        """Poll until the job ends and every node has recorded the last round's metrics."""
        first = self.nodes[0]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(first, job_id)
            if on_progress:  # the rounds view is the heavier read: only for a progress display
                on_progress(job, self.rounds(first, job_id))
            if job["status"] in TERMINAL:
                if job["status"] != "finished" or self._all_nodes_recorded(job_id, job["rounds"]):
                    return job
            self._check_alive()
            time.sleep(1.0)
        raise TimeoutError(f"job {job_id} did not end within {timeout_s:.0f}s")

    def _all_nodes_recorded(self, job_id: int, total_rounds: int) -> bool:
        for node in self.nodes:
            rounds = self.rounds(node, job_id)
            if len(rounds) < total_rounds or rounds[-1].get("metrics") is None:
                return False
        return True

    def _check_alive(self) -> None:
        for node in self.nodes:
            for what, process in (("web", node.web.process), ("agent", node.agent), ("worker", node.worker)):
                if process is not None and process.poll() is not None:
                    raise RuntimeError(
                        f"{node.spec.name}'s {what} process exited; logs in {node.web.data_dir}"
                    )


def _address_space_limit(limit: int) -> Callable[[], None]:
    """Run in the child before exec: cap its address space, so a read that tries to hold a
    bomb fails with MemoryError in that process instead of exhausting the machine."""

    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _raise_for(response: requests.Response) -> None:
    if response.status_code >= 400:
        raise RuntimeError(
            f"{response.request.method} {response.url} -> {response.status_code}: {response.text[:500]}"
        )


def _mariadb_execute(url: str, statement: str) -> None:
    from urllib.parse import urlparse

    import MySQLdb  # type: ignore[import-untyped]  # no stubs installed

    parsed = urlparse(url)
    connection = MySQLdb.connect(
        host=parsed.hostname,
        port=parsed.port or 3306,
        user=parsed.username or "root",
        passwd=parsed.password or "",
    )
    try:
        connection.cursor().execute(statement)
    finally:
        connection.close()


def _redis_flush(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()
