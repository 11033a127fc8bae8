"""Add-remove accounting and the DP count it rests on: the sampled curve is Opacus's, unsampled
releases cost what they cost under replace-one, an independent accountant agrees, calibration
composes the count, and the registered count and blob capacity follow from public values only."""

import json

import numpy as np
import pytest
from opacus.accountants.analysis import rdp as opacus_rdp

from fl_node.dp_count import COUNT_NOISE_STD, blob_capacity, count_release, noisy_count
from fl_node.job.config import ConfigError, DPConfig, JobConfig
from fl_node.job.plan import participant_plan
from fl_node.privacy import (
    ADD_REMOVE,
    ORDERS,
    REPLACE_ONE,
    BudgetLedger,
    PrivacyHistory,
    add_remove_rdp,
    calibrate_noise,
    epsilon,
    pld_epsilon,
    rdp_epsilon,
    replace_one_rdp,
)
from fl_node.privacy_audit import assert_claim_holds, audit
from fl_node.privacy_plan import job_epsilon, plan_privacy, spends_history
from fl_node.secure_random import SecureRandom


@pytest.mark.parametrize(("sigma", "rate"), [(0.6, 0.01), (1.0, 0.2), (3.3, 0.13), (12.0, 0.5)])
def test_sampled_curve_is_opacus_and_below_replace_one(sigma, rate):
    ours = add_remove_rdp(sigma, rate)
    theirs = opacus_rdp.compute_rdp(q=rate, noise_multiplier=sigma, steps=1, orders=list(ORDERS))
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert np.all(ours <= replace_one_rdp(sigma, rate) + 1e-15)
    assert np.any(ours < replace_one_rdp(sigma, rate))


def test_unsampled_releases_cost_the_same_under_both():
    """A whole clipped update or a count moves by two bounds when a record is added as well."""
    np.testing.assert_allclose(add_remove_rdp(2.0, 1.0), replace_one_rdp(2.0, 1.0))
    np.testing.assert_allclose(add_remove_rdp(2.0, 1.0), 2 * np.asarray(ORDERS) / 4.0)


def _mixed_history():
    history = PrivacyHistory()
    history.record(noise_multiplier=2 * COUNT_NOISE_STD, sample_rate=1.0)  # the count
    history.record(noise_multiplier=3.27, sample_rate=0.133, steps=240)  # DP-SGD
    history.record(noise_multiplier=36.0, sample_rate=1.0, steps=30)  # scores
    return history


def test_independent_audit_agrees_under_add_remove():
    history = _mixed_history()
    claimed = rdp_epsilon(history, delta=1e-5, adjacency=ADD_REMOVE)
    result = assert_claim_holds(history, delta=1e-5, claimed_epsilon=claimed, adjacency=ADD_REMOVE)
    assert result.adjacency == ADD_REMOVE and result.rdp_curve_ok
    assert result.pld_epsilon <= claimed
    # The same history under replace-one costs more, and an add-remove claim fails its audit.
    replace_one = rdp_epsilon(history, delta=1e-5, adjacency=REPLACE_ONE)
    assert replace_one > 1.5 * claimed
    assert not audit(history, delta=1e-5, claimed_epsilon=claimed, adjacency=REPLACE_ONE).holds


def test_pld_and_epsilon_take_the_adjacency():
    history = _mixed_history()
    assert pld_epsilon(history, delta=1e-5, adjacency=ADD_REMOVE) < pld_epsilon(history, delta=1e-5)
    assert epsilon(history, delta=1e-5, accountant="pld", adjacency=ADD_REMOVE) == pld_epsilon(
        history, delta=1e-5, adjacency=ADD_REMOVE
    )
    with pytest.raises(ValueError, match="adjacency"):
        rdp_epsilon(history, delta=1e-5, adjacency="swap")


def test_calibration_composes_the_count_and_holds_the_target():
    count = tuple(count_release().history().as_tuples())
    alone = calibrate_noise(target_epsilon=3.0, delta=1e-5, sample_rate=0.13, steps=240, adjacency=ADD_REMOVE)
    with_count = calibrate_noise(
        target_epsilon=3.0, delta=1e-5, sample_rate=0.13, steps=240, adjacency=ADD_REMOVE, prior=count
    )
    assert with_count > alone
    history = PrivacyHistory()
    history.record(noise_multiplier=count[0][0], sample_rate=1.0)
    history.record(noise_multiplier=with_count, sample_rate=0.13, steps=240)
    assert rdp_epsilon(history, delta=1e-5, adjacency=ADD_REMOVE) <= 3.0
    replace_one = calibrate_noise(target_epsilon=3.0, delta=1e-5, sample_rate=0.13, steps=240)
    assert with_count < 0.7 * replace_one  # what add-remove buys for the same target
    with pytest.raises(ValueError, match="prior"):
        calibrate_noise(
            target_epsilon=0.05, delta=1e-5, sample_rate=0.13, steps=10, adjacency=ADD_REMOVE, prior=count
        )


def _job(rounds: int, **dp) -> JobConfig:
    return JobConfig(
        name="j",
        model="mlp",
        input_shape=(4,),
        num_classes=2,
        schema_hash="0" * 64,
        rounds=rounds,
        dp=DPConfig(**dp),
    )


def test_an_add_remove_plan_includes_the_count_in_the_job_figure():
    job = _job(10, mode="sgd", target_epsilon=3.0, adjacency=ADD_REMOVE)
    plan = participant_plan(job, samples=900, public_holdout=False, scores_per_round=3)
    assert plan.adjacency == ADD_REMOVE and plan.count == count_release()
    spends = [(0, plan.train.steps)] * 10
    figure = job_epsilon(plan, spends)
    assert 2.9 < figure <= 3.0
    # The count is in the figure: the job's releases alone cost less.
    alone = rdp_epsilon(spends_history(plan, spends), delta=plan.delta, adjacency=ADD_REMOVE)
    assert alone < figure
    replace_one = participant_plan(
        _job(10, mode="sgd", target_epsilon=3.0), samples=900, public_holdout=False, scores_per_round=3
    )
    assert replace_one.adjacency == REPLACE_ONE and replace_one.count is None
    assert replace_one.train.noise_multiplier > 1.5 * plan.train.noise_multiplier
    with pytest.raises(ValueError, match="count release"):
        plan_privacy(
            mode="sgd",
            target_epsilon=3.0,
            delta=1e-5,
            rounds=10,
            num_train=720,
            num_records=900,
            batch_size=64,
            adjacency=ADD_REMOVE,
        )


def test_job_configs_without_the_field_keep_their_bytes_and_mean_replace_one():
    job = _job(1, mode="sgd", target_epsilon=1.0)
    assert b"adjacency" not in job.to_bytes()
    assert JobConfig.from_dict(json.loads(job.to_bytes())).dp.adjacency == REPLACE_ONE
    chosen = {"mode": "sgd", "target_epsilon": 1.0, "adjacency": ADD_REMOVE}
    added = JobConfig.from_dict(json.loads(job.to_bytes()) | {"dp": chosen})
    assert b'"adjacency":"add-remove"' in added.to_bytes()
    with pytest.raises(ConfigError) as refused:
        _job(1, mode="sgd", target_epsilon=1.0, adjacency="swap")
    assert refused.value.field == "dp.adjacency"


def test_noisy_count_is_noisy_bounded_and_refuses_bad_sizes():
    draws = [noisy_count(1000, randomness=SecureRandom.derive(b"k" * 32, "count", i)) for i in range(400)]
    assert 1000 - 100 < min(draws) and max(draws) < 1000 + 100
    assert 15 < float(np.std(draws)) < 25
    assert abs(float(np.mean(draws)) - 1000) < 4
    assert min(noisy_count(1) for _ in range(50)) >= 1  # never below one record
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError):
            noisy_count(bad)


def test_blob_capacity_follows_the_count_alone():
    assert blob_capacity(500) == 500 + 120
    with pytest.raises(ValueError):
        blob_capacity(0)


def test_a_ledger_composes_under_its_adjacency_and_round_trips():
    ledger = BudgetLedger(epsilon_cap=3.0, delta=1e-5, history=_mixed_history(), adjacency=ADD_REMOVE)
    assert ledger.spent() == rdp_epsilon(_mixed_history(), delta=1e-5, adjacency=ADD_REMOVE)
    restored = BudgetLedger.from_json(ledger.to_json())
    assert restored.adjacency == ADD_REMOVE and restored.spent() == ledger.spent()
