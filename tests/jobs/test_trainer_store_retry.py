"""A trainer's round cut twice, before training and when storing: one release, charged once.

Two node identities on an in-process chain (a committee of one, one trainer). The trainer's
first attempt fails between reserving the round's release and training (nothing computed): the
retry takes that reservation over instead of reserving again. Its store keeps blobs at R=2 with
a quorum of 2 and its one peer refuses connections (a real closed port), so storing the sealed
update fails with NotEnoughReplicas after training. The peer comes back (a store that answers)
and the action is retried: the same update (same content hash) is stored and submitted, the
round's release is reserved once and released, and the spend on chain is that one release's.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest
from eth_account import Account
from jobs_helpers import acting_as, add_dataset, digits_parts, draw_committee, job_request, make_nodes

from backend.jobs import chain
from backend.jobs.models import RoundAction, UpdateKey
from backend.peers.signing import RequestSigner
from backend.swarm.api import Swarm
from backend.swarm.client import LocalTransport, PeerClient
from backend.swarm.errors import NotEnoughReplicas
from backend.swarm.network import Network, Node
from backend.swarm.peers import Peer
from backend.swarm.store import ChunkStore

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: connections are refused


def _tick(ctx, monkeypatch, node):
    from backend.jobs.driver import actions, agent

    outcomes = []
    with acting_as(node, monkeypatch):
        agent.tick(ctx, lambda due: outcomes.append((due.kind, actions.run(ctx, due))))
    return outcomes


def test_a_failed_store_retries_the_same_update_under_one_release(operator_client, monkeypatch, tmp_path):
    from backend.datasets.models import PrivacyRelease
    from backend.jobs.driver import state
    from backend.ledger import models as mirror

    nodes = make_nodes(2, seed="store-retry")
    datasets = [
        add_dataset(n, monkeypatch, x, y, name=f"digits-{i}")
        for i, (n, (x, y)) in enumerate(zip(nodes, digits_parts(2), strict=True))
    ]
    request = job_request(datasets[0].pk, rounds=1, local_epochs=1, committee_size=1, min_trainers=1)
    with acting_as(nodes[0], monkeypatch):
        job_id = operator_client.post("/api/jobs", request, format="json").json()["id"]
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = operator_client.post(f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}, format="json")
            assert joined.status_code == 200, joined.content
    with acting_as(nodes[0], monkeypatch):
        assert operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json").status_code == 200
    draw_committee(nodes, job_id)
    chain.sync_mirror(nodes[0].ctx)
    job = mirror.Job.objects.get(job_id=job_id)
    trainer = next(n for n in nodes if n.ctx.address not in state.seats(job, 1))

    # The trainer's store: its own chunks (where the job's models are) and a peer that is down.
    own = trainer.ctx.swarm.store
    peer = Peer(Account.create().address, f"http://127.0.0.1:{_closed_port()}")
    signer = RequestSigner(bytes(trainer.account.key))
    down = Node(peer, PeerClient(peer.url, signer, receiver=peer.address, allow_private=True, timeout_s=2.0))
    network = Network(
        [Node(Peer(trainer.ctx.address, ""), LocalTransport(own), local=True), down],
        replication=2,
        min_replicas=2,
        threads=2,
    )
    ctx = dataclasses.replace(trainer.ctx, swarm=Swarm(own, network))
    dataset = state.my_dataset(job, ctx.address)
    releases = PrivacyRelease.objects.filter(dataset_id=dataset.pk, job=str(job_id), round=1)

    # First attempt: cut after its release is reserved, before training (a misconfigured attack
    # hook, looked up between the two): nothing was computed under the reservation.
    cut = _tick(dataclasses.replace(ctx, attack="no-such-attack"), monkeypatch, trainer)
    assert [kind for kind, _ in cut] == ["train"], cut
    claim = RoundAction.objects.get(node=ctx.address, job_id=job_id, round=1, kind="train")
    assert claim.state == RoundAction.State.FAILED and "unknown attack" in claim.detail, claim.detail
    assert [(r.kind, r.status) for r in releases] == [("dp_sgd", PrivacyRelease.Status.RESERVED)]

    # Second attempt: takes that reservation over, trains, and fails to store (the peer is down).
    first = _tick(ctx, monkeypatch, trainer)
    assert [kind for kind, _ in first] == ["train"], first
    claim.refresh_from_db()
    assert claim.state == RoundAction.State.FAILED and "NotEnoughReplicas" in claim.detail, claim.detail
    assert not job.updates.filter(round=1).exists()
    trained = UpdateKey.objects.get(node=ctx.address, job_id=job_id, round=1, trainer=ctx.address)
    assert [(r.kind, r.status) for r in releases.all()] == [("dp_sgd", PrivacyRelease.Status.RESERVED)]

    # The peer is back (a store that answers at its address): the retry stores the same update.
    network.nodes[1] = Node(peer, LocalTransport(ChunkStore(tmp_path / "peer", fsync=False)))
    network.mark_up(network.nodes[1])
    second = _tick(ctx, monkeypatch, trainer)
    assert [kind for kind, _ in second] == ["train"], second
    claim.refresh_from_db()
    assert claim.state == RoundAction.State.DONE, claim.detail
    chain.sync_mirror(nodes[0].ctx)
    update = job.updates.get(round=1, trainer=ctx.address)
    assert update.content_hash.lower() == trained.content_hash.lower(), "the retry trained a new update"
    assert [(r.kind, r.status) for r in releases.all()] == [("dp_sgd", PrivacyRelease.Status.RELEASED)]
    spent = nodes[0].ctx.ledger.data.privacy_spent_by_job(int(dataset.onchain_id), job_id)
    assert spent == max(releases.get().micro_epsilon, 1)
    with pytest.raises(NotEnoughReplicas):  # the store really needed the peer: R=2, both copies
        Swarm(own, Network([network.nodes[0], down], replication=2, min_replicas=2, threads=1)).put(b"x" * 10)
