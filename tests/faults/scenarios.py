"""Fault scenarios on a real local federation, shared by tests/faults and bench/faults.py.

Each ``run_*`` drives one job through the operator's REST API (LocalFederation's helpers, so the
round protocol may change under them) with a fault injected mid-round, and returns what the
tests assert and the bench prints: the job, the chain's events and sent calls, and the seconds
each recovery took.
"""

from __future__ import annotations

import time

import numpy as np
from faultnet import (
    ProxiedFederation,
    chain,
    duplicates,
    events,
    kill_node,
    restart_node,
    sent_transactions,
    wait_until,
)
from phases import training_began, update_pending

from devnet.localnet import LocalFederation

ROUNDS = 3
# The killed trainer's job: one round more. While it is down each round waits for its update
# deadline; its restart (web server, agent, its data loaded and noise calibrated again) took
# longer than two such rounds on a 2-core machine at load ~19, and the job ended before it
# could train again.
KILL_ROUNDS = ROUNDS + 1
ROUND_TIMEOUT_S = 60


def digits_parts(parts: int, *, brightness: float = 1.0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The digits split in ``parts``; ``brightness`` below 1 dims every image (other records)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0 * brightness).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    return [(x[idx], y[idx]) for idx in np.array_split(order, parts)]


def job_payload(
    dataset_id: int, *, rounds: int = ROUNDS, round_timeout_s: int = ROUND_TIMEOUT_S, **overrides
) -> dict:
    """The fault scenarios' job; ``overrides``: other fields of the job request (committee_size, ...)."""
    return {
        "name": "faults",
        "model": "mlp",
        "dataset": dataset_id,
        "rounds": rounds,
        "local_epochs": 2,
        "batch_size": 32,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 8.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 1,
        "top_k": 2,
        "min_trainers": 1,
        "round_timeout_s": round_timeout_s,
    } | overrides


def start_job(federation: LocalFederation, *, brightness: float = 1.0, **options) -> int:
    """Upload each node's part of the digits, create the job, join it everywhere and start it.

    A node refuses records it has registered already, and a provider's datasets share one privacy
    budget unless declared disjoint: a second job on the same federation passes another
    ``brightness`` (records of its own), and its datasets are declared disjoint (budgets of their
    own, which the first job has not spent)."""
    parts = digits_parts(len(federation.nodes), brightness=brightness)
    datasets = [
        federation.upload_dataset(
            node,
            x,
            y,
            name=f"{node.spec.name}-digits",
            classes=range(10),
            epsilon_cap=10.0,
            disjoint=brightness != 1.0,
        )
        for node, (x, y) in zip(federation.nodes, parts, strict=True)
    ]
    job = federation.create_job(federation.nodes[0], job_payload(datasets[0]["id"], **options))
    for node, dataset in zip(federation.nodes, datasets, strict=True):
        federation.join(node, job["id"], dataset["id"])
    # Minutes on a loaded machine (each node loads its data and calibrates its noise).
    assert federation.wait_prepared(job["id"], timeout_s=900), "a node did not prepare round 1"
    federation.start_job(federation.nodes[0], job["id"])
    return job["id"]


def round_phase(federation: LocalFederation, job_id: int, number: int, node=None) -> str | None:
    """The phase of round ``number`` as ``node`` (the first node by default) mirrors it."""
    for round_ in federation.rounds(node or federation.nodes[0], job_id):
        if round_["round"] == number:
            return round_["phase"]
    return None


def run_kill_a_trainer(federation: LocalFederation) -> dict:
    """The scenario (also bench/faults.py): returns what the assertions and the bench need."""
    # Four nodes: with the victim gone, three stay to hold every new blob at R=3 (three nodes
    # would do too: an upload needs a majority of R, test_upload_quorum.py).
    job_id = start_job(federation, rounds=KILL_ROUNDS)

    # The contract draws round 1's committee; whoever trains round 1 is off it. The victim is the
    # first node seen with its round-1 update pending (its release reserved, the update not yet on
    # chain), read from the nodes' own databases and anvil: through the API a short training is
    # over before it is seen, and a running training task alone is a window a starved poller
    # can miss.
    def pending_trainer():
        pending = [n for n in reversed(federation.nodes) if update_pending(federation, n, job_id, 1)]
        if not pending:
            return None
        submitted = {
            e.args["trainer"].lower()
            for e in events(federation, job_id)
            if e.name == "UpdateSubmitted" and e.args["round"] == 1
        }
        return next((n for n in pending if n.address.lower() not in submitted), None)

    victim = wait_until(pending_trainer, 300, "a node with its round-1 update pending", every_s=0.02)
    killed_at = time.monotonic()
    kill_node(victim)
    witness = next(n for n in federation.nodes if n is not victim)
    wait_until(
        lambda: round_phase(federation, job_id, 1, witness) not in (None, "training"),
        600,
        "round 1 finalized",
    )
    finalized_after_s = time.monotonic() - killed_at
    rounds = federation.rounds(witness, job_id)
    seated = {a.lower() for r in rounds if r["round"] == 1 for a in r["committee"]}
    assert victim.address.lower() not in seated, "a committee member was seen training"
    committee = next(n for n in federation.nodes if n.address.lower() in seated)
    restarted_at = time.monotonic()
    restart_node(victim)
    victim_address = victim.address.lower()

    def victim_submitted_later():
        return any(
            e.name == "UpdateSubmitted"
            and e.args["trainer"].lower() == victim_address
            and e.args["round"] > 1
            for e in events(federation, job_id)
        )

    def victim_worked_later():
        """An update or revealed scores of the victim in a later round: committees are drawn
        uniformly each round, so the restarted node may sit on every later committee (it scores
        then, and cannot train)."""
        return any(
            (e.name, (e.args.get("trainer") or e.args.get("member") or "").lower())
            in (("UpdateSubmitted", victim_address), ("ScoresSubmitted", victim_address))
            and e.args["round"] > 1
            for e in events(federation, job_id)
        )

    job = federation.wait_for_job(job_id, timeout_s=1500)
    caught_up_s = time.monotonic() - restarted_at
    return {
        "job_id": job_id,
        "job": job,
        "committee": committee.address.lower(),
        "victim": victim_address,
        "victim_submitted_later": victim_submitted_later(),
        "victim_worked_later": victim_worked_later(),
        "round_finalized_without_victim_s": finalized_after_s,
        "restart_to_job_end_s": caught_up_s,
        "events": events(federation, job_id),
        "calls": sent_transactions(federation),
        "victim_rounds": federation.rounds(victim, job_id),
    }


def _blocks_with_transactions_after(federation: LocalFederation, since_block: int) -> int | None:
    """The first block after ``since_block`` holding a transaction (read from anvil directly)."""
    w3 = chain(federation)
    for number in range(since_block + 1, w3.eth.block_number + 1):
        if w3.eth.get_block(number).transactions:
            return number
    return None


def run_rpc_outage(federation: ProxiedFederation, *, outage_s: float = 10.0) -> dict:
    """The nodes lose the chain's RPC endpoint for ``outage_s`` mid-round, then get it back."""
    job_id = start_job(federation)
    # The outage starts once a trainer has begun round 1, seen in the nodes' own databases: a
    # round of this job takes about a second on a fast machine, so a fixed wait after the API
    # shows round 1 training could cut the endpoint as the job's last transaction was sent, and
    # no transaction would come after it. From here, at least the last rounds' updates, scores
    # and models are still to be sent (checked on anvil below), so the job cannot end while the
    # endpoint is dark.
    wait_until(
        lambda: any(training_began(federation, n, job_id, 1) for n in federation.nodes),
        300,
        "a node that began training round 1",
        every_s=0.02,
    )
    w3 = chain(federation)  # anvil directly, not through the proxy
    federation.proxy.go_dark()
    finished = [e for e in events(federation, job_id) if e.name == "JobFinished"]
    assert not finished, "the job ended before the outage began: the scenario cut nothing"
    time.sleep(outage_s)
    # Read while still dark: no node can have sent anything since, so every later block holds
    # a transaction sent after the outage.
    block_at_return = w3.eth.block_number
    federation.proxy.come_back()
    back_at = time.monotonic()
    first = wait_until(
        lambda: _blocks_with_transactions_after(federation, block_at_return),
        600,
        "a transaction after the outage",
    )
    first_tx_after_s = time.monotonic() - back_at
    job = federation.wait_for_job(job_id, timeout_s=1500)
    calls = sent_transactions(federation)
    return {
        "job_id": job_id,
        "job": job,
        "first_block_after_outage": first,
        "first_transaction_after_outage_s": first_tx_after_s,
        "outage_to_job_end_s": time.monotonic() - back_at,
        "events": events(federation, job_id),
        "calls": calls,
        "duplicates": duplicates(calls),
        "rounds_by_node": {
            node.address.lower(): federation.rounds(node, job_id) for node in federation.nodes
        },
    }
