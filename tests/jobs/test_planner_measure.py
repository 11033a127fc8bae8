"""When the planner serves and measures a fixed model: serving at once, measuring unless scoring.

Mirror rows only (no chain): the planner derives everything from them.
"""

from __future__ import annotations

import pytest
from jobs_helpers import mirror_job

from backend.jobs.driver import planner
from backend.jobs.models import RoundAction, RoundMetric
from backend.ledger import models as mirror
from backend.serving.models import GlobalModel as ServedModel

pytestmark = pytest.mark.django_db

NODES = [f"0x{i:040x}" for i in range(1, 5)]  # node 0 is round 2's committee, 1-3 train
ME, SCORER = NODES[1], NODES[0]
Kind = RoundAction.Kind
FAR = 10**12  # deadlines far ahead: only the updates decide


def a_job(status=mirror.Job.Status.RUNNING) -> mirror.Job:
    job = mirror_job(NODES, status=status)  # round 2 training
    job.rounds_set.create(
        number=1, status=mirror.Round.Status.DONE, base_model_hash="0x3", update_deadline=FAR,
        score_deadline=FAR, opened_block=1,
    )  # fmt: skip
    job.committee_seats.create(round=2, seat=0, member=SCORER)
    job.global_models.create(round=1, model_hash="0x4", reference="0x5", proposer=SCORER, fixed_block=2)
    return job


def submit(job: mirror.Job, trainers) -> None:
    for i, trainer in enumerate(trainers):
        job.updates.create(round=2, trainer=trainer, index=i, reference="0x6", content_hash="0x7", samples=9)


def planned(address: str, kind: str) -> list[int]:
    return [d.round for d in planner.due_actions(address, now=0) if d.kind == kind]


def scores_from(member: str) -> None:
    mirror.ChainEvent.objects.create(
        contract="FederatedLearning", address="0xfl", name="ScoresSubmitted", block_number=3,
        tx_hash="0xtx", log_index=0, args={"jobId": 7, "round": 2, "member": member},
    )  # fmt: skip


def test_a_fixed_model_is_served_at_once_and_measured_except_by_the_member_scoring_the_next_round():
    job = a_job()
    assert planned(ME, Kind.REGISTER) == [1]
    assert planned(SCORER, Kind.REGISTER) == [1]
    ServedModel.objects.create(
        job="7", round=1, architecture="cnn", input_shape=[1, 28, 28], num_classes=10, content_hash="4"
    )
    assert planned(ME, Kind.REGISTER) == []
    assert planned(ME, Kind.MEASURE) == [1]  # a trainer: its agent plans it once its update is out
    submit(job, NODES[1:])
    assert planned(SCORER, Kind.MEASURE) == []  # it scores round 2's updates in the same process
    scores_from(SCORER)
    assert planned(SCORER, Kind.MEASURE) == [1]
    RoundMetric.objects.create(
        node=ME, job_id=7, round=1, accuracy=0.5, loss=1.0, epsilon=0.1, model_hash="0x4"
    )
    assert planned(ME, Kind.MEASURE) == []


def test_the_scorer_measures_once_its_round_is_finalized_or_the_job_is_over():
    job = a_job()
    assert planned(SCORER, Kind.MEASURE) == []
    job.rounds_set.filter(number=2).update(status=mirror.Round.Status.AGGREGATING)
    assert planned(SCORER, Kind.MEASURE) == [1]
    job.rounds_set.filter(number=2).update(status=mirror.Round.Status.TRAINING)
    mirror.Job.objects.filter(pk=job.pk).update(status=mirror.Job.Status.CANCELLED)
    assert planned(SCORER, Kind.MEASURE) == [1]
