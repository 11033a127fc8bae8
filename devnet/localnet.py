"""A local federation on one machine: a chain, the contracts, and N node processes.

The chain is one anvil (``chain="anvil"``, the default: every node talks to it, blocks at once or
every ``block_time`` s) or a consortium (``chain="consortium"``): one Clique validator per
organization (devnet/clique.py, the EthereumJS client), each node's processes talking to their
own organization's validator only, the contracts compiled for london.

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
from devnet.clique import CliqueError, CliqueNetwork
from devnet.process import REPO_ROOT, NodeProcess

OPERATOR = "operator"
TERMINAL = {"finished", "failed", "cancelled"}
CHAINS = ("anvil", "consortium")


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
    # "anvil": one shared anvil; "consortium": a Clique validator per organization (module doc).
    chain: str = "anvil"
    # Seconds between blocks: anvil's --block-time (None: a block per transaction), the
    # consortium's Clique period (None: 2 s).
    block_time: float | None = None
    anvil: AnvilProcess | None = None
    clique: CliqueNetwork | None = None
    nodes: list[LocalNode] = field(default_factory=list)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalFederation:
        if self.chain not in CHAINS:
            raise ValueError(f"chain must be one of {', '.join(CHAINS)}, not {self.chain!r}")
        self.root = Path(self.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        contracts = self.root / "contracts.json"
        for spec in self.specs:
            web = NodeProcess(self.root / spec.name, env=self._node_env(spec, contracts))
            web.extra_env["DEFL_NODE_ENDPOINT"] = web.url
            self.nodes.append(LocalNode(spec, web))
        for node, url in zip(self.nodes, self._start_chain(), strict=True):
            node.web.extra_env["DEFL_CHAIN_URL"] = url
        self._prepare_databases()
        first = self.nodes[0]
        first.web.manage(
            "ledger", "deploy", *(["--allow-small-committees"] if self.allow_small_committees else [])
        )
        small = ", development flag: small committees allowed" if self.allow_small_committees else ""
        self.log(f"contracts deployed ({contracts}{small})")
        self._register_nodes()
        for node in self.nodes:
            node.web.start(wait=False)
        for node in self.nodes:
            node.web.wait_ready(120)
            node.start_agent()
            if node.spec.celery:
                node.start_worker()
        self.log("nodes up: " + ", ".join(f"{n.spec.name} {n.url}" for n in self.nodes))
        return self

    def _register_nodes(self) -> None:
        """Each node's key registered on chain and voted in by the members before it, and its
        operator's account created. Every step is a process of its own (``manage.py``, a second or
        two of imports): the steps that do not depend on each other run side by side, the first
        node's registration (it founds the consortium) and the admission votes (each applicant needs
        the members before it, which must be members themselves) one after another."""
        # Each organization reads the chain from its own validator: what one did must have reached
        # every validator before the next acts on it (anvil: at once).
        self.wait_chain_settled()
        first, applicants = self.nodes[0], self.nodes[1:]

        def add_operator(node: LocalNode) -> None:
            out = node.web.manage(
                "node", "adduser", OPERATOR, "--role", "operator", "--password-env", "DEFL_DEMO_PASSWORD"
            ).stdout
            node.token = out.rsplit("API token:", 1)[1].strip()

        def apply(node: LocalNode) -> None:
            node.web.manage("node", "init")
            add_operator(node)

        first.web.manage("node", "init")
        self.wait_chain_settled()
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            steps = [pool.submit(add_operator, first), *(pool.submit(apply, n) for n in applicants)]
            for step in steps:
                step.result()  # a step's failure is the start's
        self.log(f"node {first.spec.name}: {first.address} registered")
        for i, node in enumerate(applicants, start=1):
            for voter in self.nodes[:i]:  # the members vote the applicant in
                self.wait_chain_settled()
                voter.web.manage("node", "admit", node.address)
            self.wait_chain_settled()
            self.log(f"node {node.spec.name}: {node.address} registered")

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
        if self.clique is not None:
            self.clique.stop()

    def _start_chain(self) -> list[str]:
        """Start the chain; each node's own JSON-RPC endpoint, in node order."""
        if self.chain == "consortium":
            # A lagging in-turn validator that catches up as the next in line fills its turn
            # seals a second block of the same height, and this client never leaves a fork it
            # sealed itself (docs/ARCHITECTURE.md, "consortium chain"): a start whose validators
            # do not settle on one head is stopped and a fresh chain started once more.
            for attempt in (1, 2):
                try:
                    self.clique = CliqueNetwork(
                        self.root / ("chain" if attempt == 1 else f"chain-{attempt}"),
                        validators_count=len(self.nodes),
                        block_time=int(self.block_time or 2),
                        funded=[node.address for node in self.nodes],  # gas money: no faucet RPC on it
                        log=self.log,
                    ).start()
                    break
                except CliqueError as exc:
                    if attempt == 2:
                        raise
                    self.log(f"the validators did not settle on one head ({exc}); a fresh chain")
            assert self.clique is not None
            return self.clique.urls  # organization i's validator, for node i alone
        self.anvil = AnvilProcess(block_time=self.block_time).start()
        every = f", a block every {self.block_time:g} s" if self.block_time else ""
        self.log(f"chain: anvil at {self.anvil.url}{every}")
        return [self.anvil.url] * len(self.nodes)

    def wait_chain_settled(self, timeout_s: float = 120, extra_blocks: int = 0) -> None:
        """Wait until every organization's validator holds the newest block any of them had
        when called, and ``extra_blocks`` more (a no-op on the one anvil)."""
        if self.clique is None:
            return
        validators = [v for v in self.clique.validators if v.running]
        deadline = time.monotonic() + timeout_s
        target: int | None = None
        while time.monotonic() < deadline:
            try:  # a loaded validator may drop a connection: ask again
                heads = [v.head() for v in validators]
            except OSError:
                time.sleep(0.5)
                continue
            target = max(heads) + extra_blocks if target is None else target
            if min(heads) >= target:
                return
            time.sleep(0.25)
        raise TimeoutError(f"the validators did not all reach block {target} in {timeout_s:.0f}s")

    @property
    def chain_urls(self) -> list[str]:
        """Each node's own chain endpoint (the same anvil for all, or its organization's validator)."""
        return [node.web.extra_env["DEFL_CHAIN_URL"] for node in self.nodes]

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _node_env(self, spec: NodeSpec, contracts: Path) -> dict[str, str]:
        env = {
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
        if self.chain == "consortium":
            env["DEFL_EVM_VERSION"] = "london"  # the EthereumJS client's Clique stops before the merge
        return env

    def _prepare_databases(self) -> None:
        """Every node's database, migrated, side by side; the first SQLite one first, which makes
        the schema the others copy when this checkout has none yet (NodeProcess.migrate)."""
        first_sqlite = next((i for i, n in enumerate(self.nodes) if n.spec.database != "mariadb"), None)
        if first_sqlite is not None:
            self._prepare_database(self.nodes[first_sqlite], first_sqlite)
        rest = [(n, i) for i, n in enumerate(self.nodes) if i != first_sqlite]
        with ThreadPoolExecutor(max(1, len(rest))) as pool:
            for prepared in [pool.submit(self._prepare_database, *entry) for entry in rest]:
                prepared.result()

    def _prepare_database(self, node: LocalNode, index: int) -> None:
        if node.spec.database == "mariadb":
            node.database_name = f"defl_{node.spec.name}_{uuid.uuid4().hex[:8]}"
            _mariadb_execute(
                self.mariadb_url, f"CREATE DATABASE `{node.database_name}` CHARACTER SET utf8mb4"
            )
            node.web.extra_env["DATABASE_URL"] = f"{self.mariadb_url}/{node.database_name}"
        node.web.migrate()  # SQLite: a copy of this checkout's migrated schema (NodeProcess.migrate)
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
        disjoint: bool = False,
    ) -> dict:
        """Upload a dataset to ``node``; ``disjoint``: its provider declares it shares no record with
        the node's other datasets, so it gets a privacy budget of its own (else it shares theirs)."""
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        data = {
            "name": name,
            "format": "npz",
            "epsilon_cap": epsilon_cap,
            "delta": delta,
            "classes": ",".join(str(c) for c in classes),
            "disjoint": "true" if disjoint else "false",
        }
        files = {"file": (f"{name}.npz", buffer.getvalue(), "application/octet-stream")}
        response = node.api().post(f"{node.url}/api/datasets", data=data, files=files, timeout=120)
        _raise_for(response)
        return response.json()

    def create_job(self, node: LocalNode, payload: dict) -> dict:
        # The proposer's checks read the members' datasets from its mirror, which stays
        # DEFL_CONFIRMATIONS (1) behind its own validator's head on a consortium chain: every
        # validator one block past the newest registration first (a no-op on anvil).
        self.wait_chain_settled(extra_blocks=2)
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

        def prepared(node: LocalNode) -> bool:
            job = self._job_if_answered(node, job_id) or {}
            return bool((job.get("joined") or {}).get("prepared"))

        while waiting and time.monotonic() < deadline:
            waiting = [n for n in waiting if not prepared(n)]
            if waiting:
                time.sleep(0.25)
        return not waiting

    def _job_if_answered(self, node: LocalNode, job_id: int) -> dict | None:
        """The job as ``node`` reports it, or None when its API does not answer within the request's
        timeout: the waits ask again until their own deadline (on a loaded machine, CI with two other
        federations and Chromium beside it, one GET took over 30 s)."""
        try:
            return self.job(node, job_id)
        except requests.Timeout:
            return None

    def start_job(self, node: LocalNode, job_id: int) -> dict:
        # On a consortium each organization reads its own validator: the proposer's must hold every
        # join, a block past it (its confirmation), before the start counts the participants.
        self.wait_chain_settled(extra_blocks=1)
        response = node.api().post(f"{node.url}/api/jobs/{job_id}/start", json={}, timeout=120)
        _raise_for(response)
        return response.json()

    def wait_drawn(self, job_id: int, *, node: LocalNode | None = None, timeout_s: float = 300) -> dict:
        """The job as ``node`` (the first by default) mirrors it once its first committee is drawn.

        Starting a job only opens the draw: each participant's agent reveals the secret it committed
        to at join, and the last reveal (or anyone after the reveal deadline) draws the committee;
        until then no one, the proposer included, knows who sits. A job that ended instead (too few
        revealed: failed) is returned as it is."""
        node = node or self.nodes[0]
        deadline = time.monotonic() + timeout_s
        while True:
            job = self._job_if_answered(node, job_id)
            if job is not None and job["status"] not in ("open", "drawing"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id}'s first committee was not drawn within {timeout_s:.0f}s")
            time.sleep(0.5)

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
            try:
                job = self.job(first, job_id)
                if on_progress:  # the rounds view is the heavier read: only for a progress display
                    on_progress(job, self.rounds(first, job_id))
                if job["status"] in TERMINAL:
                    if job["status"] != "finished" or self._all_nodes_recorded(job_id, job["rounds"]):
                        return job
            except requests.Timeout:
                pass  # a node slower than the request's timeout under load: asked again (_job_if_answered)
            self._check_alive()
            time.sleep(1.0)
        raise TimeoutError(f"job {job_id} did not end within {timeout_s:.0f}s")

    def _all_nodes_recorded(self, job_id: int, total_rounds: int) -> bool:
        """Every node lists the job's rounds (as many as the first node, which saw the job end) and
        has measured the last fixed model. Fewer than ``total_rounds`` when an aggregation was
        skipped: the round after it is void (it never opens), and a skipped round fixes no model."""
        listed: int | None = None
        for node in self.nodes:
            rounds = self.rounds(node, job_id)
            listed = len(rounds) if listed is None else listed
            fixed = [r for r in rounds if r.get("global_model")]
            if not rounds or len(rounds) < min(listed, total_rounds):
                return False
            if fixed and fixed[-1].get("metrics") is None:
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
