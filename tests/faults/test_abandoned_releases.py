"""A release left reserved by a killed node is settled once its round closed without it.

A node reserves a release before it trains or scores and settles it when it publishes (or
discards) the output. SIGKILLed in between, its reservation stays open; if the round then
closes without it, no later attempt of that release comes to settle it (withhold_abandoned
runs only before a new attempt of the same release), and the job's privacy never becomes
final. Mirror and budget rows only (no chain, no process): the driver derives "closed" and
"published" from the mirror, which is all a restarted node has.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.datasets import budget
from backend.datasets.models import Dataset, PrivacyRelease
from backend.jobs.driver import actions
from backend.jobs.models import RoundAction
from backend.ledger import models as mirror
from fl_node.privacy import ReleasePlan
from tests.builders import stored_dataset

pytestmark = pytest.mark.django_db

NODES = [f"0x{i:040x}" for i in range(1, 5)]
ME, SCORER = NODES[1], NODES[0]
JOB = 7
TRAIN = ReleasePlan("dp_sgd", noise_multiplier=2.0, sample_rate=0.01, steps=1)
SCORES = ReleasePlan("score_count", noise_multiplier=20.0, sample_rate=1.0, steps=1)
Status = PrivacyRelease.Status


def _job(current_round: int, phase: str, status=mirror.Job.Status.RUNNING) -> mirror.Job:
    job = mirror.Job.objects.create(
        job_id=JOB, proposer=SCORER, config_hash="0x1", initial_model_ref="0x2", initial_model_hash="0x3",
        rounds=5, committee_size=1, top_k=3, min_trainers=1, join_deadline=0, train_period=60,
        score_period=60, status=status, current_round=current_round, proposed_block=1,
    )  # fmt: skip
    for i, node in enumerate(NODES):
        job.participants.create(node=node, dataset_id=i, index=i)
    for number in range(1, current_round + 1):
        job.rounds_set.create(
            number=number, status=phase if number == current_round else mirror.Round.Status.DONE,
            base_model_hash="0x3", update_deadline=0, score_deadline=0, opened_block=number,
        )  # fmt: skip
    return job


def _move(job: mirror.Job, *, phase: str, status: str = mirror.Job.Status.RUNNING) -> None:
    job.rounds_set.filter(number=job.current_round).update(status=phase)
    mirror.Job.objects.filter(pk=job.pk).update(status=status)


def _statuses(dataset: Dataset) -> list[tuple[int, str, str]]:
    return list(dataset.releases.order_by("id").values_list("round", "kind", "status"))


def _scores_from(member: str, round_: int) -> None:
    mirror.ChainEvent.objects.create(
        contract="FederatedLearning", address="0xfl", name="ScoresSubmitted", block_number=round_,
        tx_hash=f"0xtx{round_}", log_index=0, args={"jobId": JOB, "round": round_, "member": member},
    )  # fmt: skip


def test_reservations_of_closed_rounds_are_settled_by_what_the_chain_shows():
    dataset = stored_dataset("mine", epsilon_cap=1e6, onchain_id="1")
    job = _job(current_round=3, phase=mirror.Round.Status.TRAINING)
    me = SimpleNamespace(address=ME)
    # Round 1: killed while training, the round closed without its update.
    budget.reserve_release(dataset, JOB, 1, TRAIN)
    # Round 1 scores: killed while scoring, the scores never went out.
    budget.reserve_release(dataset, JOB, 1, SCORES)
    # Round 2: killed after submitting, before it recorded the release (the update is on chain).
    budget.reserve_release(dataset, JOB, 2, TRAIN)
    job.updates.create(round=2, trainer=ME, index=0, reference="0x6", content_hash="0x7", samples=9)
    # Round 2 scores: revealed, killed before it recorded so.
    budget.reserve_release(dataset, JOB, 2, SCORES)
    _scores_from(ME, 2)
    # Round 3 is training: its reservation belongs to an attempt that may still publish.
    budget.reserve_release(dataset, JOB, 3, TRAIN)
    spent_before = budget.budget_summary(dataset)
    RoundAction.objects.create(node=ME, job_id=JOB, round=3, kind=RoundAction.Kind.TRAIN, state="running")

    assert actions.release_lost_claims(me) == 1  # the restart: what it ran is lost, what closed settles
    assert _statuses(dataset) == [
        (1, "dp_sgd", Status.WITHHELD),
        (1, "score_count", Status.WITHHELD),
        (2, "dp_sgd", Status.RELEASED),
        (2, "score_count", Status.RELEASED),
        (3, "dp_sgd", Status.RESERVED),
    ]
    # Settled, never uncounted: the budget's total is what it was, now spent rather than reserved.
    after = budget.budget_summary(dataset)
    assert after["epsilon_spent"] + after["epsilon_reserved"] == pytest.approx(
        spent_before["epsilon_spent"] + spent_before["epsilon_reserved"]
    )
    assert after["epsilon_reserved"] > 0  # round 3's, still open

    # Round 3 finalized without this node (it aggregates): closed. A speculative round-4
    # reservation (trained on its own aggregate while round 3 aggregates) is not.
    _move(job, phase=mirror.Round.Status.AGGREGATING)
    budget.reserve_release(dataset, JOB, 4, TRAIN)
    actions.settle_closed_releases(me, JOB)
    assert _statuses(dataset)[4:] == [(3, "dp_sgd", Status.WITHHELD), (4, "dp_sgd", Status.RESERVED)]

    # The job ended: nothing can be published any more.
    _move(job, phase=mirror.Round.Status.DONE, status=mirror.Job.Status.FINISHED)
    actions.settle_closed_releases(me, JOB)
    assert not dataset.releases.filter(status=Status.RESERVED).exists()


def test_another_jobs_and_another_nodes_reservations_are_left_alone():
    dataset = stored_dataset("mine", epsilon_cap=1e6, onchain_id="1")
    _job(current_round=3, phase=mirror.Round.Status.TRAINING)
    budget.reserve_release(dataset, JOB + 1, 1, TRAIN)  # another job, same dataset
    actions.settle_closed_releases(SimpleNamespace(address=NODES[3]), JOB)  # no dataset of its own here
    actions.settle_closed_releases(SimpleNamespace(address="0x" + "f" * 40), JOB)  # not a participant
    actions.settle_closed_releases(SimpleNamespace(address=ME), JOB + 99)  # an unknown job
    actions.settle_closed_releases(SimpleNamespace(address=ME), JOB)
    assert _statuses(dataset) == [(1, "dp_sgd", Status.RESERVED)]


def test_more_open_reservations_than_one_call_settles_are_all_settled():
    dataset = stored_dataset("mine", epsilon_cap=1e6, onchain_id="1")
    _job(current_round=2, phase=mirror.Round.Status.TRAINING)
    for _ in range(budget.MAX_ABANDONED * 2 + 3):  # a crash loop: far more than a call's bound
        budget.reserve_release(dataset, JOB, 1, TRAIN)
    assert budget.settle_closed(dataset, JOB, 2, lambda _r, _k: False) == (0, budget.MAX_ABANDONED)
    actions.settle_closed_releases(SimpleNamespace(address=ME), JOB)
    assert not dataset.releases.filter(status=Status.RESERVED).exists()
    for bad in (-1, None, True, 2.0, "2"):  # a caller's error, never a database error
        with pytest.raises(budget.InvalidInput):
            budget.settle_closed(dataset, JOB, bad, lambda _r, _k: False)
