"""Contribution accounting pays useful work only (issue 32): votes for the pair the round fixed,
reveals that scored every update and agreed with the committee's decision on at least half."""

from __future__ import annotations

import pytest
from eth_utils import keccak

from backend.ledger import models
from backend.ledger.contributions import contributions

HONEST, GARBAGE, LAZY, WRONG_VOTE, TRAINER_A, TRAINER_B = (f"0x{i:040x}" for i in range(1, 7))
REF, BOGUS = "0x" + "44" * 32, "0x" + "55" * 32
MODEL = "0x" + "33" * 32


def _event(name: str, index: int, **args) -> None:
    models.ChainEvent.objects.create(
        contract="FederatedLearning",
        name=name,
        args={"jobId": 1, "round": 1, **args},
        block_number=index,
        tx_hash=f"0x{index:064x}",
        log_index=0,
    )


@pytest.mark.django_db
def test_garbage_reveals_and_votes_for_a_losing_pair_earn_nothing():
    job = models.Job.objects.create(
        job_id=1,
        proposer=HONEST,
        config_hash="0x",
        initial_model_ref="0x",
        initial_model_hash="0x",
        rounds=1,
        committee_size=3,
        top_k=2,
        min_trainers=1,
        join_deadline=0,
        train_period=1,
        score_period=1,
        margin=100,
        status="finished",
        proposed_block=1,
    )
    for index, node in enumerate((HONEST, GARBAGE, LAZY, WRONG_VOTE, TRAINER_A, TRAINER_B)):
        models.Participant.objects.create(job=job, node=node, dataset_id=index + 1, index=index)
    models.Update.objects.create(
        job=job,
        round=1,
        trainer=TRAINER_A,
        index=0,
        reference="0x",
        content_hash="0x",
        samples=1,
        median=8000,
        rank=0,
        accepted=True,
    )
    models.Update.objects.create(
        job=job,
        round=1,
        trainer=TRAINER_B,
        index=1,
        reference="0x",
        content_hash="0x",
        samples=1,
        median=4000,
        accepted=False,
    )
    trainers = [TRAINER_A, TRAINER_B]
    _event("ScoresSubmitted", 1, member=HONEST, trainers=trainers, scores=[8000, 4000], baseScore=5000)
    _event(
        "ScoresSubmitted", 2, member=GARBAGE, trainers=trainers, scores=[0, 10_000], baseScore=5000
    )  # every decision wrong
    _event(
        "ScoresSubmitted", 3, member=LAZY, trainers=[TRAINER_A], scores=[9000], baseScore=5000
    )  # one update skipped
    digest = "0x" + keccak(bytes.fromhex(REF[2:])).hex()
    _event("GlobalModelVoted", 4, member=HONEST, modelRef=REF, modelHash=MODEL, votes=1, needed=2)
    _event("GlobalModelVoted", 5, member=LAZY, modelRef=REF, modelHash=MODEL, votes=2, needed=2)
    _event("GlobalModelVoted", 6, member=WRONG_VOTE, modelRef=BOGUS, modelHash=MODEL, votes=1, needed=2)
    _event("GlobalModelFixed", 7, modelHash=MODEL, referenceDigest=digest, proposer=HONEST)
    rows = {row["node"]: row for row in contributions(job)}
    assert (rows[HONEST]["reveals"], rows[HONEST]["votes"]) == (1, 1)
    assert (rows[GARBAGE]["reveals"], rows[GARBAGE]["votes"], rows[GARBAGE]["share"]) == (0, 0, 0.0)
    assert (rows[LAZY]["reveals"], rows[LAZY]["votes"]) == (0, 1)
    assert (rows[WRONG_VOTE]["votes"], rows[WRONG_VOTE]["share"]) == (0, 0.0)
    assert rows[TRAINER_A]["accepted_updates"] == 1 and rows[TRAINER_B]["share"] == 0.0
