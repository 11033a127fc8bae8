"""Several node identities in one process: one in-process chain, one chunk store, one database.

Each ``Node`` is a NodeContext (its own key and ledger client). ``acting_as`` routes the
datasets app's ledger access and the jobs API's ``_node`` to one node. The nodes share the
chunk store (a stand-in for the swarm) and the database: their own rows are keyed by
address, and the chain's mirror is the same for all of them.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import numpy as np

CLASSES = tuple(str(i) for i in range(10))


@dataclass
class Node:
    ctx: object
    account: object


def make_nodes(count: int, seed: str, *, allow_small_committees: bool = True, **ctx_options) -> list[Node]:
    """``allow_small_committees``: a development deployment (committees of 1, 2 or even sizes)."""
    from backend.jobs.context import NodeContext, peer_access
    from backend.jobs.remote_config import NodeLimits
    from backend.ledger.chains import ensure_funds, new_in_process_chain
    from backend.ledger.client import ChainClient
    from backend.ledger.deployment import Ledger, deploy_contracts
    from backend.swarm.factory import node_swarm
    from devnet.consortium import bootstrap_consortium, dev_account

    w3 = new_in_process_chain()
    accounts = [dev_account(i, seed) for i in range(count)]
    for account in accounts:
        ensure_funds(w3, account.address)
    clients = [ChainClient(w3, account) for account in accounts]
    deployment = deploy_contracts(clients[0], allow_small_committees=allow_small_committees)
    ledgers = [Ledger(client, deployment) for client in clients]
    bootstrap_consortium(ledgers, [f"http://n{i}.test" for i in range(count)])
    swarm = node_swarm()
    options = {"proposer_fallback_s": 60.0, "retry_after_s": 0.0} | ctx_options
    limits = NodeLimits.from_settings()
    return [
        Node(
            NodeContext(
                address=a.address,
                ledger=lg,
                swarm=swarm,
                peers=peer_access(bytes(a.key)),
                limits=limits,
                **options,
            ),
            a,
        )
        for a, lg in zip(accounts, ledgers, strict=True)
    ]


@contextlib.contextmanager
def acting_as(node: Node, monkeypatch):
    """Route the datasets app's ledger and the jobs API to ``node`` for the duration."""
    from backend.jobs_api import views
    from backend.ledger import access as ledger_access

    with monkeypatch.context() as patch:
        patch.setattr(ledger_access, "node_ledger", lambda: node.ctx.ledger)
        patch.setattr(views, "_node", lambda: node.ctx)
        yield node


def npz_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    return buffer.getvalue()


def add_dataset(node: Node, monkeypatch, x, y, *, name: str, epsilon_cap: float = 50.0):
    from backend.datasets import services

    # The simulated nodes share one database: each node's dataset is another provider's, so each
    # is declared disjoint (a budget of its own) rather than joining one provider's shared budget.
    upload = services.Upload(
        name=name,
        format="npz",
        data=npz_bytes(x, y),
        epsilon_cap=epsilon_cap,
        delta=1e-5,
        classes=CLASSES,
        disjoint=True,
    )
    with acting_as(node, monkeypatch):
        return services.create_dataset(upload)


def digits_parts(parts: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    return [(x[idx], y[idx]) for idx in np.array_split(order, parts)]


def job_request(dataset_id: int, **overrides) -> dict:
    body = {
        "name": "digits-dp",
        "model": "mlp",
        "dataset": dataset_id,
        "rounds": 2,
        "local_epochs": 3,
        "batch_size": 32,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 20.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 2,
        "top_k": 2,
        "min_trainers": 2,
        "round_timeout_s": 600,
    }
    return body | overrides


def mirror_job(nodes: list[str], *, status=None, round_status=None, job_id: int = 7):
    """A job in the chain's mirror (no chain): ``nodes`` joined in order (node 0 proposed it, a
    committee of one), running in round 2, whose row has ``round_status`` (training by default)
    and deadlines far ahead."""
    from backend.ledger import models as mirror

    far = 10**12
    job = mirror.Job.objects.create(
        job_id=job_id, proposer=nodes[0], config_hash="0x1", initial_model_ref="0x2",
        initial_model_hash="0x3", rounds=5, committee_size=1, top_k=3, min_trainers=3, join_deadline=0,
        train_period=60, score_period=60, status=status or mirror.Job.Status.RUNNING, current_round=2,
        proposed_block=1,
    )  # fmt: skip
    for i, node in enumerate(nodes):
        job.participants.create(node=node, dataset_id=i, index=i, drawn=True)  # revealed its draw secret
    job.rounds_set.create(
        number=2, status=round_status or mirror.Round.Status.TRAINING, base_model_hash="0x4",
        update_deadline=far, score_deadline=far, opened_block=2,
    )  # fmt: skip
    return job


def draw_committee(nodes: list[Node], job_id: int) -> list[str]:
    """After the proposer started ``job_id``: every participant's draw secret revealed (what each
    node's agent does at its next tick, sent here at once), so the first committee is drawn and
    round 1 open. The committee in seat order."""
    from backend.jobs import chain
    from backend.ledger.resources import JobStatus

    fl = nodes[0].ctx.ledger.fl
    for node in nodes:
        if fl.get_job(job_id).status is not JobStatus.DRAWING:
            break
        info = fl.get_participant(job_id, node.ctx.address)
        if info.joined and not info.drawn:
            chain.reveal_draw_secret(node.ctx, job_id)
    for node in nodes:
        chain.sync_mirror(node.ctx)
    return fl.committee(job_id)
