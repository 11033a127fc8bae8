"""Where a node is in a round, read the way the node itself knows it, and what a round left behind.

The fault tests kill a node in a given phase of its work. The chain says which phase the round
is in; the node's own action rows (``jobs_roundaction`` in its database, written before and
after each action runs) say what the node is doing in it: a SCORE row for round r that is not
done means it has started scoring r, an AGGREGATE row that it has started aggregating. The
test process reads the node's SQLite file read-only, as a monitoring tool would.

``model_copies`` downloads every node's copy of every round's global model through its REST
API (the model registry, which serves the bytes it stores) and hashes them: the property the
fault tests end with is that each copy hashes to the chain's ``GlobalModelFixed``.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from urllib.parse import urlparse

from faultnet import events

from devnet.localnet import LocalFederation, LocalNode


class FastFallbackFederation(LocalFederation):
    """A LocalFederation whose stand-ins act after ``fallback_s`` instead of the default 20 s.

    A member that waits for the designated one (seat 0 finalizing, proposing or skipping) takes
    over after this long; with a member killed that wait is on every such round's path.
    """

    fallback_s: float = 4.0

    def _node_env(self, spec, contracts):
        env = super()._node_env(spec, contracts)
        env["DEFL_PROPOSER_FALLBACK_S"] = str(self.fallback_s)
        return env


def node_rows(
    node: LocalNode, sql: str, *params, mariadb_url: str = LocalFederation.mariadb_url
) -> list[tuple]:
    """Rows of ``sql`` (``?`` placeholders) read from the node's own database, SQLite or MariaDB
    (on the federation's ``mariadb_url``); [] while it cannot answer (locked by a writer, not
    migrated yet, its server restarting).

    Milliseconds a read, against a second or more for the node's REST API on a loaded machine:
    fast enough to catch a phase that lasts a second.
    """
    if node.spec.database == "mariadb":
        import MySQLdb

        url = urlparse(mariadb_url)
        try:
            connection = MySQLdb.connect(
                host=url.hostname or "127.0.0.1",
                port=url.port or 3306,
                user=url.username or "root",
                passwd=url.password or "",
                db=node.database_name,
                connect_timeout=2,
            )
        except MySQLdb.Error:
            return []
        try:
            cursor = connection.cursor()
            cursor.execute(sql.replace("?", "%s"), params)
            return list(cursor.fetchall())
        except MySQLdb.Error:
            return []
        finally:
            connection.close()
    path = node.web.data_dir / "db.sqlite3"
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
    except sqlite3.Error:
        return []
    try:
        return list(connection.execute(sql, params))
    except sqlite3.Error:
        return []
    finally:
        connection.close()


def actions_of(node: LocalNode, job_id: int) -> list[tuple[int, str, str]]:
    """(round, kind, state) of the node's action rows for the job (a node on SQLite); [] while its
    database is busy."""
    return node_rows(
        node,
        "SELECT round, kind, state FROM jobs_roundaction WHERE job_id = ? AND lower(node) = lower(?)",
        job_id,
        node.address,
    )


def update_pending(federation: LocalFederation, node: LocalNode, job_id: int, round_: int) -> bool:
    """Whether the node's training release of ``round_`` is reserved and not yet settled: it began
    the round's training (the release is reserved before the training starts) and has not
    published the update (the release is marked released once the update is on chain). A scenario
    that kills a trainer before its update needs this window: it spans the training, the sealing,
    the upload and the submit, where a running training task alone lasts well under a second, and
    a starved poller can sleep through it. (The submit is on chain a moment before the release is
    marked: check the chain too, ``scenarios.run_kill_a_trainer``.)"""
    return bool(
        node_rows(
            node,
            "SELECT 1 FROM datasets_privacyrelease WHERE job = ? AND round = ? AND kind = 'dp_sgd' "
            "AND status = 'reserved'",
            str(job_id),
            round_,
            mariadb_url=federation.mariadb_url,
        )
    )


def training_began(federation: LocalFederation, node: LocalNode, job_id: int, round_: int) -> bool:
    """Whether the node has begun training ``round_``: its training task of the round (a cluster
    task) is running or has run, its release reserved before it started. (A queued task is not
    training yet: the agent queues it when it dispatches the action, before the action has even
    begun.)

    A task that has already succeeded counts too: a round-1 training of digits lasts well under
    a second, and a poller starved on a loaded machine can sleep through all of it (CI waited
    300 s for a training it had missed). The scenarios need a point inside the round, after a
    trainer began and before the round's scores and model are sent, and this still gives one.

    Read from the node's database: the API's rounds view lists a round's releases only, and
    once it answers on a loaded machine a short training may be over.
    """
    return bool(
        node_rows(
            node,
            "SELECT 1 FROM cluster_task WHERE job_id = ? AND round = ? AND kind = 'train' "
            "AND state IN ('running', 'succeeded')",
            job_id,
            round_,
            mariadb_url=federation.mariadb_url,
        )
    )


def has_action(node: LocalNode, job_id: int, round_: int, kind: str, *, open_only: bool = True) -> bool:
    """Whether the node has started ``kind`` of ``round_`` (and, ``open_only``, not finished it)."""
    return any(
        r == round_ and k == kind and (not open_only or state != "done")
        for r, k, state in actions_of(node, job_id)
    )


def node_by_address(federation: LocalFederation, address: str) -> LocalNode:
    return next(n for n in federation.nodes if n.address.lower() == address.lower())


def round_info(federation: LocalFederation, job_id: int, number: int, node: LocalNode | None = None) -> dict:
    for round_ in federation.rounds(node or federation.nodes[0], job_id):
        if round_["round"] == number:
            return round_
    return {}


def fl_events(federation: LocalFederation, job_id: int, name: str, round_: int | None = None) -> list:
    return [
        e
        for e in events(federation, job_id)
        if e.name == name and (round_ is None or e.args["round"] == round_)
    ]


def acted(federation: LocalFederation, job_id: int, name: str, round_: int, who: str, field: str) -> bool:
    """Whether ``who`` sent the event ``name`` (its address in ``field``) in ``round_``."""
    return any(e.args[field].lower() == who.lower() for e in fl_events(federation, job_id, name, round_))


def fixed_hashes(federation: LocalFederation, job_id: int) -> dict[int, str]:
    """round -> the model hash the chain fixed (0x hex, lower case)."""
    return {
        e.args["round"]: str(e.args["modelHash"]).lower()
        for e in fl_events(federation, job_id, "GlobalModelFixed")
    }


def model_copies(federation: LocalFederation, job_id: int, nodes=None) -> dict[str, dict[int, str]]:
    """node address -> round -> the SHA-256 (0x hex) of the model bytes that node serves."""
    copies: dict[str, dict[int, str]] = {}
    for node in nodes or federation.nodes:
        session = node.api()
        response = session.get(f"{node.url}/api/models", params={"limit": 500}, timeout=60)
        response.raise_for_status()
        body = response.json()
        rows = body["results"] if isinstance(body, dict) else body
        mine: dict[int, str] = {}
        for row in rows:
            if int(row["job"]) != int(job_id):
                continue
            data = session.get(f"{node.url}/api/models/{row['id']}/download", timeout=120)
            data.raise_for_status()
            mine[int(row["round"])] = "0x" + hashlib.sha256(data.content).hexdigest()
        copies[node.address.lower()] = mine
    return copies


def copies_disagreeing(federation: LocalFederation, job_id: int, nodes=None) -> dict:
    """Every (node, round) whose copy is missing or hashes to something else than the chain's fix
    (of ``nodes``, every node by default)."""
    fixed = fixed_hashes(federation, job_id)
    bad = {}
    for node, mine in model_copies(federation, job_id, nodes).items():
        for number, model_hash in fixed.items():
            if mine.get(number) != model_hash:
                bad[(node, number)] = (mine.get(number), model_hash)
    return bad


def wait_for_copies(federation: LocalFederation, job_id: int, nodes=None, timeout_s: float = 180) -> dict:
    """Wait until every node serves every fixed model (registering runs beside the rounds);
    returns what still disagrees when the time is up ({} when all agree)."""
    deadline = time.monotonic() + timeout_s
    while True:
        bad = copies_disagreeing(federation, job_id, nodes)
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(2)
