"""Replace-one accounting (the default; add-remove in test_add_remove.py): the quadrature against closed forms and adaptive quadrature, PLD beneath
RDP, replace-one never cheaper than add/remove; budgets compose and refuse; the update mechanism
clips and noises."""

import json
import math
import warnings

import numpy as np
import pytest
import torch
from opacus.accountants.analysis import rdp as add_remove_rdp

from fl_node.privacy import (
    ORDERS,
    REPLACE_ONE,
    BudgetLedger,
    PrivacyBudgetExceeded,
    PrivacyHistory,
    UpdateGaussianMechanism,
    calibrate_noise,
    clip_update,
    epsilon,
    global_norm,
    replace_one_rdp,
)
from fl_node.privacy_audit import INTEGER_ORDERS, independent_rdp_curve


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


def test_the_default_accounting_is_replace_one():
    history = _history()
    assert epsilon(history, delta=1e-5) == epsilon(history, delta=1e-5, adjacency=REPLACE_ONE)


@pytest.mark.parametrize(("sigma", "rate"), [(0.6, 0.01), (1.0, 0.2), (3.7, 0.18), (12.0, 0.5), (1.0, 0.95)])
def test_replace_one_curve_agrees_with_adaptive_quadrature(sigma, rate):
    """Two numerical methods on the same divergence: the trapezoid rule and scipy's adaptive quad."""
    history = PrivacyHistory()
    history.record(noise_multiplier=sigma, sample_rate=rate)
    ours = replace_one_rdp(sigma, rate)[[list(ORDERS).index(a) for a in INTEGER_ORDERS]]
    np.testing.assert_allclose(ours, independent_rdp_curve(history), rtol=1e-9)


def test_replace_one_unsampled_is_two_gaussians_two_apart_and_costs_more_than_add_remove():
    np.testing.assert_allclose(replace_one_rdp(3.0, 1.0), 2 * np.asarray(ORDERS) / 9.0)
    # Sampled: never below the add/remove curve of the same mechanism (a replacement is worse
    # than a removal), and close to it only where the sampling makes both negligible.
    for sigma, rate in [(1.0, 0.05), (3.7, 0.18), (8.0, 0.6)]:
        ours = replace_one_rdp(sigma, rate)
        theirs = add_remove_rdp.compute_rdp(q=rate, noise_multiplier=sigma, steps=1, orders=list(ORDERS))
        assert np.all(ours >= theirs)


def test_pld_is_beneath_rdp_and_both_are_replace_one():
    history = _history()
    rdp, pld = epsilon(history, delta=1e-5), epsilon(history, delta=1e-5, accountant="pld")
    assert 0 < pld <= rdp
    add_remove = add_remove_rdp.get_privacy_spent(
        orders=list(ORDERS),
        rdp=sum(
            add_remove_rdp.compute_rdp(q=q, noise_multiplier=s, steps=n, orders=list(ORDERS))
            for s, q, n in history.as_tuples()
        ),
        delta=1e-5,
    )[0]
    assert rdp > add_remove  # the same releases cost more under replace-one
    assert epsilon(PrivacyHistory(), delta=1e-5) == 0.0


def test_bad_accountant_and_mechanism_parameters():
    with pytest.raises(ValueError, match="unknown accountant 'prv'"):
        epsilon(_history(), delta=1e-5, accountant="prv")  # Opacus's PRV is add/remove only
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
    single.record(noise_multiplier=2.0, sample_rate=0.05, steps=200)
    one_job = epsilon(single, delta=1e-5)
    for _ in range(2):
        ledger.record(noise_multiplier=2.0, sample_rate=0.05, steps=200)
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
    # Neighbouring clipped updates are up to 2C apart: the per-record bound is C, the accountant
    # sees std / C = z under replace-one (two Gaussians 2C apart).
    assert mech.history.as_tuples() == [(2.0, 0.4, 2)]
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
    assert figures["adjacency"] == "replace-one"
    assert figures["epsilon_pld"] <= figures["epsilon_rdp"] == pytest.approx(epsilon(_history(), delta=1e-5))
