"""Accounting matches Opacus, budgets compose and refuse, the update mechanism clips and noises."""

import json
import math
import warnings

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from fl_node.privacy import (
    BudgetLedger,
    PrivacyBudgetExceeded,
    PrivacyHistory,
    UpdateGaussianMechanism,
    calibrate_noise,
    clip_update,
    epsilon,
    global_norm,
)


def _history():
    history = PrivacyHistory()
    for _ in range(30):
        history.record(noise_multiplier=1.1, sample_rate=0.02)
    history.record(noise_multiplier=0.9, sample_rate=0.05, steps=50)
    return history


def test_history_merges_runs_and_round_trips_json():
    history = _history()
    assert history.as_tuples() == [(1.1, 0.02, 30), (0.9, 0.05, 50)]
    assert history.total_steps == 80
    restored = PrivacyHistory.from_json(history.to_json())
    assert restored == history
    json.loads(history.to_json())  # plain JSON a node can store


def test_epsilons_match_opacus_accountants():
    history = _history()
    rdp, prv = RDPAccountant(), PRVAccountant()
    rdp.history = history.as_tuples()
    prv.history = history.as_tuples()
    assert epsilon(history, delta=1e-5) == pytest.approx(rdp.get_epsilon(delta=1e-5), rel=1e-9)
    assert epsilon(history, delta=1e-5, accountant="prv") == pytest.approx(
        prv.get_epsilon(delta=1e-5), rel=1e-6
    )
    # PRV is the tighter bound, RDP the conservative one that budgets enforce
    assert epsilon(history, delta=1e-5, accountant="prv") <= epsilon(history, delta=1e-5)
    assert epsilon(PrivacyHistory(), delta=1e-5) == 0.0


def test_bad_accountant_and_mechanism_parameters():
    with pytest.raises(ValueError, match="unknown accountant 'gdp2'"):
        epsilon(_history(), delta=1e-5, accountant="gdp2")
    with pytest.raises(ValueError, match="delta"):
        epsilon(_history(), delta=0)
    with pytest.raises(ValueError, match="sample_rate"):
        PrivacyHistory().record(noise_multiplier=1.0, sample_rate=1.5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        PrivacyHistory().record(noise_multiplier=0.0, sample_rate=0.1)


def test_calibrated_noise_meets_target():
    sigma = calibrate_noise(target_epsilon=3.0, delta=1e-5, sample_rate=0.02, steps=1000)
    history = PrivacyHistory()
    history.record(noise_multiplier=sigma, sample_rate=0.02, steps=1000)
    assert 2.95 <= epsilon(history, delta=1e-5) <= 3.0


def test_ledger_composes_with_rdp_not_by_adding_epsilons():
    ledger = BudgetLedger(epsilon_cap=10.0, delta=1e-5)
    single = PrivacyHistory()
    single.record(noise_multiplier=1.0, sample_rate=0.05, steps=200)
    one_job = epsilon(single, delta=1e-5)
    for _ in range(2):
        ledger.record(noise_multiplier=1.0, sample_rate=0.05, steps=200)
    assert one_job < ledger.spent() < 2 * one_job
    assert ledger.remaining() == pytest.approx(10.0 - ledger.spent())
    assert BudgetLedger.from_json(ledger.to_json()).spent() == pytest.approx(ledger.spent())


def test_ledger_refuses_over_budget_and_spends_nothing():
    ledger = BudgetLedger(epsilon_cap=2.0, delta=1e-5)
    ledger.record(noise_multiplier=3.0, sample_rate=0.05, steps=50)
    assert ledger.spent() < 1.0
    before = ledger.history.as_tuples()
    with pytest.raises(PrivacyBudgetExceeded, match="cap is 2"):
        ledger.check(noise_multiplier=1.0, sample_rate=0.05, steps=5000)
    assert ledger.history.as_tuples() == before
    assert ledger.check(noise_multiplier=5.0, sample_rate=0.05, steps=10) <= 2.0


@pytest.mark.parametrize("kwargs", [{"epsilon_cap": 0, "delta": 1e-5}, {"epsilon_cap": 1, "delta": 1.0}])
def test_ledger_validates(kwargs):
    with pytest.raises(ValueError):
        BudgetLedger(**kwargs)


def _update():
    return {"w": torch.full((10, 10), 1.0), "b": torch.full((10,), -2.0), "count": torch.tensor(3)}


def test_clip_update_bounds_global_norm():
    update = _update()
    norm = global_norm(update)
    assert norm == pytest.approx(math.sqrt(100 + 40))
    clipped = clip_update(update, clip_norm=1.0)
    assert global_norm(clipped) == pytest.approx(1.0, rel=1e-6)
    # direction kept, small updates left alone, integer entries untouched
    assert torch.allclose(clipped["w"] / clipped["b"][0], update["w"] / update["b"][0])
    assert global_norm(clip_update(update, clip_norm=100.0)) == pytest.approx(norm)
    assert torch.equal(clipped["count"], update["count"])
    with pytest.raises(ValueError, match="non-finite"):
        clip_update({"w": torch.tensor([float("nan")])}, clip_norm=1.0)


def test_update_mechanism_noise_scale_and_accounting():
    mech = UpdateGaussianMechanism(clip_norm=0.5, noise_multiplier=2.0, sampling_fraction=0.4)
    big = {"w": torch.full((200, 200), 3.0)}
    noised = mech.privatize(big)
    clipped = clip_update(big, clip_norm=0.5)["w"]
    assert (noised["w"] - clipped).std().item() == pytest.approx(1.0, rel=0.03)  # z * C = 2 * 0.5
    mech.privatize(big)
    # Record-level sensitivity 2C: the accountant sees std / (2C) = z / 2.
    assert mech.history.as_tuples() == [(1.0, 0.4, 2)]
    assert mech.epsilon(delta=1e-5) > 0


def test_update_mechanism_validates_and_warns():
    with pytest.raises(ValueError, match="clip_norm"):
        UpdateGaussianMechanism(clip_norm=0, noise_multiplier=1.0, sampling_fraction=0.5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        UpdateGaussianMechanism(clip_norm=1, noise_multiplier=-1.0, sampling_fraction=0.5)
    with pytest.raises(ValueError, match="sampling_fraction"):
        UpdateGaussianMechanism(clip_norm=1, noise_multiplier=1.0, sampling_fraction=0.0)
    mech = UpdateGaussianMechanism(clip_norm=1, noise_multiplier=1.0, sampling_fraction=0.5)
    with pytest.warns(UserWarning, match="not floating point") as record:
        mech.privatize(_update())
    assert record[0].filename == __file__  # stacklevel points at the caller
    with pytest.warns(UserWarning, match="only 2 of 3"):
        mech.check_participation(participants=2, expected=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mech.check_participation(participants=3, expected=3)


def test_privacy_spent_snapshot_is_json_ready():
    from fl_node.privacy import PrivacySpent

    history = _history()
    spent = PrivacySpent.of(history, delta=1e-5)
    history.record(noise_multiplier=3.0, sample_rate=0.5, steps=5)  # the snapshot does not move
    figures = json.loads(json.dumps(spent.as_dict()))
    assert figures["steps"] == 80 and figures["noise_multiplier"] == 0.9 and figures["sample_rate"] == 0.05
    assert figures["epsilon_prv"] <= figures["epsilon_rdp"] == pytest.approx(epsilon(_history(), delta=1e-5))
