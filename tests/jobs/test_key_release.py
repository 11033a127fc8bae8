"""When a trainer's node may hand out its update's key: the mirror first, the contract otherwise.

A key request from the committee (and every aggregator) arrives the moment the last update lands,
and each answer is on the round's critical path. The node decides from its mirror of the chain
when that already shows the training over by the job's state; only otherwise does it read the
contract (state, then the clock for the deadline). A decision to release is remembered.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jobs_helpers import mirror_job

from backend.jobs import chain
from backend.jobs.driver.memory import DriverMemory
from backend.jobs.sealed import key_release
from backend.ledger import models as mirror

pytestmark = pytest.mark.django_db

NODES = [f"0x{i:040x}" for i in range(1, 5)]  # node 0 is round 2's committee, 1-3 train


def a_job(status=None, round_status=None) -> mirror.Job:
    return mirror_job(NODES, status=status, round_status=round_status)  # round 2, a committee of one


def submit(job: mirror.Job, trainers) -> None:
    for i, trainer in enumerate(trainers):
        job.updates.create(
            round=2, trainer=trainer, index=i, reference="0x6", content_hash=f"0x{i}", samples=9
        )


def test_the_mirror_shows_the_training_over_only_with_every_trainers_update_in():
    job = a_job()
    submit(job, NODES[1:3])
    assert not key_release._over_in_mirror(7, 2)  # two of the three trainers
    submit_last = job.updates.create(
        round=2, trainer=NODES[3], index=2, reference="0x6", content_hash="0x9", samples=9
    )
    assert submit_last and key_release._over_in_mirror(7, 2)
    assert key_release._over_in_mirror(7, 1)  # an earlier round
    assert not key_release._over_in_mirror(7, 3)  # a round not open yet
    assert not key_release._over_in_mirror(8, 2)  # a job this mirror does not know


def test_a_participant_that_never_revealed_its_draw_secret_is_no_trainer_to_wait_for():
    job = a_job()
    job.participants.filter(node=NODES[3]).update(drawn=False)  # took no part after the draw
    submit(job, NODES[1:3])
    assert key_release._over_in_mirror(7, 2)  # the two drawn trainers are in
    on_chain = Contract(update_count=2, now=0).state
    on_chain.reveal_count = 3
    assert key_release.training_over(on_chain, 2, 0)
    on_chain.reveal_count = 4
    assert not key_release.training_over(on_chain, 2, 0)


def test_an_early_update_is_not_released_before_its_round_is_open_and_its_training_over():
    """An update sent early (its round still aggregating the previous one) waits for its round."""
    on_chain = Contract(update_count=0, now=0).state
    on_chain.round, on_chain.phase = 1, chain.RoundPhase.AGGREGATING
    assert not key_release.training_over(on_chain, 2, 10**9)


@pytest.mark.parametrize(
    ("status", "round_status"),
    [
        (mirror.Job.Status.RUNNING, mirror.Round.Status.AGGREGATING),
        (mirror.Job.Status.FINISHED, mirror.Round.Status.TRAINING),
    ],
)
def test_a_round_out_of_training_or_an_ended_job_releases(status, round_status):
    a_job(status=status, round_status=round_status)
    assert key_release._over_in_mirror(7, 2)


class Contract:
    """The contract as ``released`` reads it: the job's state, and the clock when it must."""

    def __init__(self, update_count: int, now: int) -> None:
        self.state = SimpleNamespace(
            round=2, status=chain.JobStatus.RUNNING, phase=chain.RoundPhase.TRAINING, participant_count=4, reveal_count=4,
            committee_size=1, update_count=update_count, update_deadline=1_000, use_blocks=False,
        )  # fmt: skip
        self.now, self.reads = now, []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(chain, "job_state", lambda _ctx, _job: self.reads.append("state") or self.state)
        monkeypatch.setattr(chain, "contract_now", lambda _ctx, _job: self.reads.append("clock") or self.now)


def test_a_lagging_mirror_leaves_the_decision_to_the_contract_and_a_release_is_remembered(monkeypatch):
    job = a_job()
    submit(job, NODES[1:3])  # the mirror lags: the last update is on chain only
    contract = Contract(update_count=3, now=0)
    contract.install(monkeypatch)
    ctx = SimpleNamespace(memory=DriverMemory())
    assert key_release.released(ctx, 7, 2)
    assert contract.reads == ["state"]  # over by the state alone: no clock read
    assert key_release.released(ctx, 7, 2) and contract.reads == ["state"]  # remembered


def test_still_training_on_chain_is_refused_until_the_deadline_passes(monkeypatch):
    a_job()
    contract = Contract(update_count=1, now=1_000)
    contract.install(monkeypatch)
    ctx = SimpleNamespace(memory=DriverMemory())
    assert not key_release.released(ctx, 7, 2)
    assert contract.reads == ["state", "clock"]
    contract.now = 1_000 + key_release.RELEASE_SLACK_S + 1  # past the deadline by more than the slack
    assert key_release.released(ctx, 7, 2)


def test_a_mirror_that_shows_it_over_reads_nothing_from_the_chain(monkeypatch):
    job = a_job()
    submit(job, NODES[1:4])
    contract = Contract(update_count=0, now=0)
    contract.install(monkeypatch)
    assert key_release.released(SimpleNamespace(memory=DriverMemory()), 7, 2)
    assert contract.reads == []
