"""Deadlines let a round finish without nodes that went away.

Six nodes, a committee of three. One trainer never shows up: the committee scores once the
update deadline passed. Then one member of the next committee (drawn uniformly from every
participant) is gone: its first seat, or the absent trainer where the draw seated it. The two
others vote at once, and their two votes fix the model (quorum 2 of 3).
"""

from __future__ import annotations

import time

import pytest
from jobs_helpers import acting_as, add_dataset, digits_parts, draw_committee, job_request, make_nodes

from backend.jobs import chain
from backend.jobs.driver import actions, agent
from backend.ledger import models as mirror

# Six in-process nodes training for real and waiting out deadlines: a minute or more on 2 cores.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def run_until(nodes, monkeypatch, done, limit_s: float = 60.0) -> None:
    """Tick the nodes in turn until ``done`` (checked before every node's tick)."""
    deadline = time.monotonic() + limit_s
    while True:
        offered = 0
        for node in nodes:
            if done():
                return
            with acting_as(node, monkeypatch):
                offered += len(agent.tick(node.ctx, lambda due, node=node: actions.run(node.ctx, due)))
        assert time.monotonic() < deadline, "the round did not finish in time"
        if not offered:
            # Waiting for a deadline. The in-process chain stamps each block one second after
            # its parent, so the many set-up blocks put its clock ahead of the wall clock, and
            # it mines only on transactions: mine empty blocks, as a live chain would.
            nodes[0].ctx.ledger.client.w3.provider.ethereum_tester.mine_blocks(1)
            time.sleep(0.05)


def test_round_finishes_without_an_absent_trainer_and_an_absent_proposer(operator_client, monkeypatch):
    nodes = make_nodes(6, seed="jobs-deadlines", proposer_fallback_s=1.0)
    datasets = [
        add_dataset(node, monkeypatch, x, y, name=f"digits-{i}")
        for i, (node, (x, y)) in enumerate(zip(nodes, digits_parts(6), strict=True))
    ]
    request = job_request(
        datasets[0].pk, rounds=1, local_epochs=1, committee_size=3, round_timeout_s=6, score_timeout_s=60
    )
    with acting_as(nodes[0], monkeypatch):
        job_id = operator_client.post("/api/jobs", request, format="json").json()["id"]
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            assert (
                operator_client.post(f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}).status_code == 200
            )
    with acting_as(nodes[0], monkeypatch):
        assert operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json").status_code == 200

    fl = nodes[0].ctx.ledger.fl
    drawn = set(draw_committee(nodes, job_id))  # the contract drew the first committee
    absent = next(node for node in reversed(nodes) if node.ctx.address not in drawn)
    present = [node for node in nodes if node is not absent]  # a trainer that never runs its agent
    run_until(present, monkeypatch, lambda: fl.get_job(job_id).phase == 1)
    job = mirror.Job.objects.get(job_id=job_id)
    assert job.updates.filter(round=1).count() == 2
    next_committee = fl.committee(job_id)
    if absent.ctx.address in next_committee:
        # The draw (uniform over every participant that revealed) seated the absent trainer: it
        # is the member gone, and no other goes (two gone of three would leave no majority).
        gone = absent
    else:
        gone = next(node for node in nodes if node.ctx.address == next_committee[0])
        present = [node for node in present if node is not gone]
    run_until(present, monkeypatch, lambda: fl.get_job(job_id).status == 3)  # Finished

    chain.sync_mirror(nodes[0].ctx)
    proposal = mirror.GlobalModelProposal.objects.get(job=job, round=1)
    voters = set(next_committee) - {gone.ctx.address}
    assert proposal.proposer in voters  # the two present members voted, at once
    assert proposal.votes == 2


def test_a_silent_committee_cannot_stall_the_job(operator_client, monkeypatch):
    """The whole elected committee goes away after the round is finalized: once the aggregation
    deadline passed, a present node skips the aggregation on chain; the round keeps the previous
    (initial) model and the job finishes instead of hanging."""
    nodes = make_nodes(5, seed="jobs-skip", proposer_fallback_s=1.0)
    datasets = [
        add_dataset(node, monkeypatch, x, y, name=f"digits-{i}")
        for i, (node, (x, y)) in enumerate(zip(nodes, digits_parts(5), strict=True))
    ]
    request = job_request(
        datasets[0].pk,
        rounds=1,
        local_epochs=1,
        committee_size=1,
        top_k=3,
        round_timeout_s=30,
        score_timeout_s=20,
    )
    with acting_as(nodes[0], monkeypatch):
        job_id = operator_client.post("/api/jobs", request, format="json").json()["id"]
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            assert (
                operator_client.post(f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}).status_code == 200
            )
    with acting_as(nodes[0], monkeypatch):
        assert operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json").status_code == 200
    draw_committee(nodes, job_id)

    fl = nodes[0].ctx.ledger.fl
    initial = fl.get_job(job_id).model_hash
    run_until(nodes, monkeypatch, lambda: fl.get_job(job_id).phase == 1)  # finalized: aggregating
    silent = set(fl.committee(job_id))
    present = [node for node in nodes if node.ctx.address not in silent]
    run_until(present, monkeypatch, lambda: fl.get_job(job_id).status == 3)  # Finished

    state = fl.get_job(job_id)
    assert state.model_hash == initial  # the previous model carried forward
    chain.sync_mirror(nodes[0].ctx)
    job = mirror.Job.objects.get(job_id=job_id)
    assert job.rounds_set.get(number=1).status == mirror.Round.Status.SKIPPED
    assert not job.proposals.filter(round=1).exists()
    skips = mirror.ChainEvent.objects.filter(name="AggregationSkipped", args__jobId=job_id)
    assert skips.count() == 1
