"""Which model a round starts from, read from the mirror (backend.jobs.driver.state.base_model).

A skipped aggregation carries the previous model forward, and the contract voids the round after
it (its early updates were trained on a model that was never fixed): that round never opens, so
the mirror has no row for it, and the round after it starts from the carried model too.
"""

from __future__ import annotations

import pytest

from backend.jobs.driver import state
from backend.jobs.driver.state import ActionError
from backend.ledger import models as mirror

pytestmark = pytest.mark.django_db

FAR = 10**12


def _job(rounds: dict[int, str], fixed: dict[int, str]) -> mirror.Job:
    """A job with a Round row per ``rounds`` (number -> status) and a fixed model per ``fixed``
    (round -> hash; its reference is 'ref-' and the hash)."""
    job = mirror.Job.objects.create(
        job_id=11, proposer="0x" + "0a" * 20, config_hash="0x1", initial_model_ref="0xinit",
        initial_model_hash="0xi0", rounds=6, committee_size=3, top_k=2, min_trainers=1, join_deadline=0,
        train_period=60, score_period=60, status=mirror.Job.Status.RUNNING, current_round=max(rounds),
        proposed_block=1,
    )  # fmt: skip
    for number, status in rounds.items():
        job.rounds_set.create(
            number=number, status=status, base_model_hash="0x0", update_deadline=FAR, score_deadline=FAR,
            opened_block=number,
        )  # fmt: skip
    for number, model_hash in fixed.items():
        job.global_models.create(
            round=number,
            model_hash=model_hash,
            reference=f"ref-{model_hash}",
            proposer="0x1",
            fixed_block=number,
        )
    return job


Status = mirror.Round.Status


def test_a_round_starts_from_the_model_fixed_before_it():
    job = _job({1: Status.DONE, 2: Status.TRAINING}, {1: "0xm1"})
    assert state.base_model(job, 2) == ("ref-0xm1", "0xm1")
    assert state.base_model(job, 1) == ("0xinit", "0xi0")


def test_the_round_after_a_skip_and_its_void_successor_start_from_the_carried_model():
    # round 2 skipped, round 3 void (no row), round 4 open: the model fixed in round 1
    job = _job({1: Status.DONE, 2: Status.SKIPPED, 4: Status.TRAINING}, {1: "0xm1"})
    assert state.base_model(job, 4) == ("ref-0xm1", "0xm1")
    assert state.base_model(job, 3) == ("ref-0xm1", "0xm1")
    # round 1 skipped, round 2 void: round 3 starts from the initial model
    job.delete()
    job = _job({1: Status.SKIPPED, 3: Status.TRAINING}, {})
    assert state.base_model(job, 3) == ("0xinit", "0xi0")


def test_a_round_after_a_skip_that_opened_starts_from_its_own_fixed_model():
    # a deployment whose skip opens the next round (no void round): round 3 starts from round 2's model
    job = _job({1: Status.SKIPPED, 2: Status.DONE, 3: Status.TRAINING}, {2: "0xm2"})
    assert state.base_model(job, 3) == ("ref-0xm2", "0xm2")


def test_a_model_not_indexed_yet_is_waited_for():
    job = _job({1: Status.DONE, 2: Status.TRAINING}, {})
    with pytest.raises(ActionError, match="not indexed yet"):
        state.base_model(job, 2)
