"""A service restarted under a two-node federation mid-round, shared by the database and broker tests.

Two nodes are the fewest a job runs on (one committee member, one trainer). ``run_with_restarts``
runs one short job and calls ``restart`` twice: while round 1 trains (the trainer's action
claimed, its privacy release reserved) and once round 2 is past training (the committee's turn).
The nodes' API may answer 500 while the service is down: every read here tolerates that. Training
is seen in the nodes' own databases (phases.training_began): through the API, a training of a
second or two was over before it was seen (the probe that timed out in CI).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from faultnet import duplicates, events, sent_transactions, wait_until
from phases import node_rows, training_began
from scenarios import start_job

from devnet.localnet import LocalFederation

ROUNDS = 2


class PairFederation(LocalFederation):
    """Two nodes: their blobs are kept at R=2 (every copy there can be)."""

    def _node_env(self, spec, contracts):
        return super()._node_env(spec, contracts) | {"DEFL_REPLICATION": "2"}


def quietly(read: Callable[[], object], default=None):
    """A read through a node's API while a service under it may be down (a 500 is expected then)."""
    try:
        return read()
    except Exception:
        return default


def phase(federation: LocalFederation, job_id: int, number: int) -> str | None:
    rounds = quietly(lambda: federation.rounds(federation.nodes[0], job_id), [])
    return next((r["phase"] for r in rounds if r["round"] == number), None)


def training(federation: LocalFederation, job_id: int, number: int) -> bool:
    """Some node has begun training round ``number`` (its release reserved, its training task run or running)."""
    return any(training_began(federation, node, job_id, number) for node in federation.nodes)


def run_with_restarts(federation: LocalFederation, restart: Callable[[], object]) -> dict:
    job_id = start_job(federation, rounds=ROUNDS)
    wait_until(lambda: training(federation, job_id, 1), 300, "round 1 training", every_s=0.02)
    restart()
    wait_until(lambda: phase(federation, job_id, 2) not in (None, "training"), 600, "round 2 past training")
    restart()
    job = federation.wait_for_job(job_id, timeout_s=900)
    # The last round's serving and measuring run beside the end of the job: wait for every
    # action to end (a claim lost by a restart would stay open, and fail the assertions).
    actions = wait_until_settled(lambda: _rows(federation, job_id, ACTIONS), SETTLE_S)
    return {
        "job_id": job_id,
        "job": job,
        "events": events(federation, job_id),
        "calls": sent_transactions(federation),
        "rounds": {n.address.lower(): federation.rounds(n, job_id) for n in federation.nodes},
        "actions": actions,
        "tasks": _rows(federation, job_id, TASKS),
    }


ACTIONS = "SELECT round, kind, state, attempts FROM jobs_roundaction WHERE job_id = ?"
TASKS = "SELECT round, kind, state, attempts FROM cluster_task WHERE job_id = ?"
SETTLE_S = 180


def _rows(federation: LocalFederation, job_id: int, sql: str) -> dict[str, list[tuple]]:
    return {
        n.address.lower(): [
            tuple(row) for row in node_rows(n, sql, job_id, mariadb_url=federation.mariadb_url)
        ]
        for n in federation.nodes
    }


def wait_until_settled(
    read: Callable[[], dict[str, list[tuple]]], timeout_s: float
) -> dict[str, list[tuple]]:
    """``read()`` once every action row it returns is done, or as it is when the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = read()
        done = all(rows.values()) and all(state == "done" for r in rows.values() for _, _, state, _ in r)
        if done or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def updates_per_round(result: dict) -> dict[int, int]:
    counts: dict[int, int] = {}
    for e in result["events"]:
        if e.name == "UpdateSubmitted":
            counts[e.args["round"]] = counts.get(e.args["round"], 0) + 1
    return counts


def training_releases(result: dict) -> list[tuple[str, int, int]]:
    """(node, round, how many training releases it recorded locally) for every round of every node."""
    return [
        (node, round_["round"], sum(1 for r in round_["privacy"] if r["kind"] == "dp_sgd"))
        for node, rounds in result["rounds"].items()
        for round_ in rounds
    ]


# ------------------------------------------------------------- what every restart test asserts
def assert_the_job_completed(result: dict) -> None:
    assert len(result["restarts_s"]) == 2, result["restarts_s"]
    assert result["job"]["status"] == "finished", result["job"]
    fixed = {e.args["round"] for e in result["events"] if e.name == "GlobalModelFixed"}
    assert fixed == set(range(1, ROUNDS + 1)), fixed


def assert_no_claim_lost(result: dict) -> None:
    """Every action row of every node ended done (none left queued, running, waiting or failed),
    and the trainer's claimed training was not dropped: each round's update is on chain."""
    for node, actions in result["actions"].items():
        assert actions, node
        assert {state for _r, _kind, state, _a in actions} == {"done"}, (node, actions)
    assert updates_per_round(result) == dict.fromkeys(range(1, ROUNDS + 1), 1), result["events"]


def assert_nothing_done_twice(result: dict) -> None:
    """No transaction sent twice, and one training release a round on every node."""
    assert duplicates(result["calls"]) == {}
    releases = training_releases(result)
    assert all(count <= 1 for _node, _round, count in releases), releases
