"""A hijacked vote: the drawn member at seat 0 votes the right model hash with a bogus reference.
The honest members recompute the aggregate AND its reference and vote for that pair, which is
fixed; the hijacked pair gets no honest vote, and the chain and every mirror name the honest
reference, whose blob is the aggregate.

Six in-process nodes on a production-rule deployment (committee of 3), one round.
"""

from __future__ import annotations

import pytest
from eth_utils import keccak
from jobs_helpers import acting_as, digits_parts, draw_committee, job_request, make_nodes
from robust_checks import add_public_dataset, check_robust_round
from test_deadlines import run_until

from backend.jobs import blobs, chain
from backend.jobs.discovery import config_of, job_record
from backend.jobs.driver import aggregator
from backend.ledger import models as mirror

pytestmark = pytest.mark.django_db

BOGUS = b"\x66" * 64  # a reference nobody can read (of the encrypted length)


def test_a_hijacked_vote_gets_no_honest_vote_and_the_honest_pair_is_fixed(operator_client, monkeypatch):
    # a fallback far beyond run_until's limit: the honest seats must vote at once
    nodes = make_nodes(6, seed="verified-proposal", allow_small_committees=False, proposer_fallback_s=600.0)
    datasets = [
        add_public_dataset(node, monkeypatch, x, y, name=f"digits-{i}")
        for i, (node, (x, y)) in enumerate(zip(nodes, digits_parts(6), strict=True))
    ]
    request = job_request(
        datasets[0].pk,
        rounds=1,
        local_epochs=1,
        committee_size=3,
        top_k=3,
        min_trainers=2,
        score_timeout_s=60,
        # the default defense (robust), scored on public hold-outs (exact): the round is checked
        # against the simulator's functions below (robust_checks)
        norm_bound=1000.0,
    )
    with acting_as(nodes[0], monkeypatch):
        created = operator_client.post("/api/jobs", request, format="json")
        assert created.status_code == 201, created.content
        job_id = created.json()["onchain_id"]
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = operator_client.post(f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}, format="json")
            assert joined.status_code == 200, joined.content
    with acting_as(nodes[0], monkeypatch):
        assert operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json").status_code == 200
    draw_committee(nodes, job_id)

    fl = nodes[0].ctx.ledger.fl
    run_until(nodes, monkeypatch, lambda: fl.get_job(job_id).phase == 1)  # finalized: aggregating
    elected = fl.committee(job_id)
    hostile = next(node for node in nodes if node.ctx.address == elected[0])
    honest = [node for node in nodes if node is not hostile]
    # The hostile seat computes the right aggregate, then votes its hash with a bogus reference.
    chain.sync_mirror(hostile.ctx)
    with acting_as(hostile, monkeypatch):
        config = config_of(job_record(hostile.ctx, job_id))
        job = mirror.Job.objects.get(job_id=job_id)
        model_hash, data = aggregator.aggregate(hostile.ctx, job, config, 1)
    hostile.ctx.ledger.fl.vote_global_model(job_id, 1, BOGUS, bytes.fromhex(model_hash[2:]))
    run_until(honest, monkeypatch, lambda: fl.get_job(job_id).status == 3)  # Finished

    state = fl.get_job(job_id)
    assert "0x" + state.model_hash.hex() == model_hash  # the right model
    chain.sync_mirror(nodes[0].ctx)
    proposals = {p.reference: p for p in mirror.GlobalModelProposal.objects.filter(job=job, round=1)}
    hijacked = proposals.pop("0x" + BOGUS.hex())
    assert hijacked.proposer == hostile.ctx.address and hijacked.votes == 1  # no honest vote
    [(reference, fixed)] = proposals.items()
    assert fixed.model_hash == model_hash and fixed.votes == 2 and fixed.proposer in elected[1:]
    assert state.model_ref_digest == keccak(bytes.fromhex(reference[2:]))
    assert mirror.GlobalModel.objects.get(job=job, round=1).reference == reference
    with acting_as(honest[0], monkeypatch):
        assert blobs.get(honest[0].ctx, reference) == data  # the reference names the aggregate
    assert config.defense == "levelled"
    checked = check_robust_round(nodes, monkeypatch, job_id, 1, config)
    assert checked["scorers"] == 3 and checked["fixed_hash"] == model_hash
    assert checked["plain_hash"] != model_hash  # the defenses changed the model: FedAvg alone differs


def test_an_unencrypted_blobs_reference_is_the_same_on_every_node(tmp_path):
    """Why confirmers can recompute the reference: an aggregate stored unencrypted is addressed by
    its bytes alone (two independent chunk stores, 2.5 chunks of data); an encrypted store is not
    (fresh chunk keys), so the aggregate must never be stored encrypted."""
    import io
    import os

    from backend.swarm.pipeline import store_stream
    from backend.swarm.store import ChunkStore

    data = os.urandom(5 << 19)
    stores = [ChunkStore(tmp_path / name, fsync=False) for name in ("a", "b")]
    plain = {str(store_stream(io.BytesIO(data), store)) for store in stores}
    assert len(plain) == 1 and len(next(iter(plain))) == 64
    sealed = {str(store_stream(io.BytesIO(data), store, encrypt=True)) for store in stores}
    assert len(sealed) == 2
