"""Fault scenarios on a real local federation, shared by tests/faults and bench/faults.py.

Each ``run_*`` drives one job through the operator's REST API (LocalFederation's helpers, so the
round protocol may change under them) with a fault injected mid-round, and returns what the
tests assert and the bench prints: the job, the chain's events and sent calls, and the seconds
each recovery took.
"""

from __future__ import annotations

import threading
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

from backend.localnet import LocalFederation

ROUNDS = 3
ROUND_TIMEOUT_S = 60


def digits_parts(parts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    return [(x[idx], y[idx]) for idx in np.array_split(order, parts)]


def job_payload(dataset_id: int, *, rounds: int = ROUNDS, round_timeout_s: int = ROUND_TIMEOUT_S) -> dict:
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
    }


def start_job(federation: LocalFederation, **options) -> int:
    datasets = [
        federation.upload_dataset(
            node, x, y, name=f"{node.spec.name}-digits", classes=range(10), epsilon_cap=10.0
        )
        for node, (x, y) in zip(federation.nodes, digits_parts(len(federation.nodes)), strict=True)
    ]
    job = federation.create_job(federation.nodes[0], job_payload(datasets[0]["id"], **options))
    for node, dataset in zip(federation.nodes, datasets, strict=True):
        federation.join(node, job["id"], dataset["id"])
    assert federation.wait_prepared(job["id"], timeout_s=300), "a node did not prepare round 1"
    federation.start_job(federation.nodes[0], job["id"])
    return job["id"]


def round_phase(federation: LocalFederation, job_id: int, number: int) -> str | None:
    for round_ in federation.rounds(federation.nodes[0], job_id):
        if round_["round"] == number:
            return round_["phase"]
    return None


def run_kill_a_trainer(federation: LocalFederation) -> dict:
    """The scenario (also bench/faults.py): returns what the assertions and the bench need."""
    # Four nodes: with the victim gone, three stay to hold every new blob at R=3 (with three
    # nodes, every upload fails NotEnoughReplicas until it is back, and the round fails).
    committee, victim = federation.nodes[0], federation.nodes[-1]
    job_id = start_job(federation)
    wait_until(lambda: round_phase(federation, job_id, 1) == "training", 120, "round 1 training")

    def victim_is_training() -> bool:
        # A trainer reserves its round's DP release before it trains and settles it when it
        # submits: a reservation of round 1 means the victim is training right now.
        for round_ in federation.rounds(victim, job_id):
            if round_["round"] == 1:
                return any(r["kind"] == "dp_sgd" and r["status"] == "reserved" for r in round_["privacy"])
        return False

    wait_until(victim_is_training, 300, "the victim training round 1", every_s=0.2)
    killed_at = time.monotonic()
    kill_node(victim)
    wait_until(lambda: round_phase(federation, job_id, 1) not in (None, "training"), 600, "round 1 finalized")
    finalized_after_s = time.monotonic() - killed_at
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

    job = federation.wait_for_job(job_id, timeout_s=1500)
    caught_up_s = time.monotonic() - restarted_at
    return {
        "job_id": job_id,
        "job": job,
        "committee": committee.address.lower(),
        "victim": victim_address,
        "victim_submitted_later": victim_submitted_later(),
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
    wait_until(lambda: round_phase(federation, job_id, 1) == "training", 120, "round 1 training")
    time.sleep(2)  # trainers are training; their submitUpdate comes during or after the outage
    w3 = chain(federation)  # anvil directly, not through the proxy
    outage = threading.Thread(target=federation.proxy.outage, args=(outage_s,))
    outage.start()
    outage.join()
    back_at = time.monotonic()
    block_at_return = w3.eth.block_number
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
