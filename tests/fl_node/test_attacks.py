"""The scripted attackers of simulations: what each one sends and claims."""

import numpy as np
import pytest
import torch

from fl_node.attacks import (
    BACKDOOR_TARGET,
    BOUND_SHARE,
    INFLATED_SAMPLES,
    TRIGGER_SIZE,
    add_trigger,
    backdoor_success,
    boost_to_bound,
    get_attack,
    parse_attack_spec,
)
from fl_node.data import ArrayDataset


def _images(n: int = 20) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 0.5, size=(n, 1, 8, 8)).astype(np.float32)
    return ArrayDataset(x, (np.arange(n) % 10).astype(np.int64))


def test_trigger_sets_the_corner_of_images_and_the_tail_of_flat_inputs_without_touching_the_input():
    data = _images()
    triggered = add_trigger(data.x)
    assert (triggered[:, :, -TRIGGER_SIZE:, -TRIGGER_SIZE:] == data.x.max()).all()
    assert np.array_equal(triggered[:, :, :-TRIGGER_SIZE], data.x[:, :, :-TRIGGER_SIZE])
    assert not (data.x[:, :, -TRIGGER_SIZE:, -TRIGGER_SIZE:] == data.x.max()).all()  # a copy
    flat = add_trigger(data.x.reshape(len(data), -1))
    assert (flat[:, -(TRIGGER_SIZE**2) :] == data.x.max()).all()


def test_backdoor_poisons_half_of_the_data_with_the_trigger_and_the_target_label():
    data = _images(40)
    poisoned = get_attack("backdoor").poison_data(data, 10)
    changed = np.flatnonzero((poisoned.x != data.x).reshape(len(data), -1).any(axis=1))
    assert len(changed) == 20
    assert (poisoned.y[changed] == BACKDOOR_TARGET).all()
    untouched = np.setdiff1d(np.arange(40), changed)
    assert np.array_equal(poisoned.y[untouched], data.y[untouched])


def test_backdoor_success_counts_triggered_inputs_of_other_classes_sent_to_the_target():
    data = _images(30)

    class CornerDetector(torch.nn.Module):
        """Says the target when the corner is bright, class 9 otherwise."""

        def forward(self, x):
            bright = x[:, 0, -1, -1] >= data.x.max()
            logits = torch.zeros(len(x), 10)
            logits[bright, BACKDOOR_TARGET] = 1.0
            logits[~bright, 9] = 1.0
            return logits

    assert backdoor_success(CornerDetector(), data.x, data.y) == 1.0
    assert (
        backdoor_success(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)), data.x, data.y)
        <= 1.0
    )
    only_target = ArrayDataset(data.x[:3], np.full(3, BACKDOOR_TARGET))
    assert backdoor_success(CornerDetector(), only_target.x, only_target.y) == 0.0


def test_copier_and_inflater_declare_what_they_do():
    assert get_attack("copy").copies and not get_attack("copy").trains
    inflate = get_attack("inflate")
    assert inflate.claimed_samples == INFLATED_SAMPLES and inflate.poison_data is not None


def test_attack_spec_bounds():
    assert parse_attack_spec("backdoor:0.4")[1] == 0.4
    with pytest.raises(ValueError, match="majority"):
        parse_attack_spec("copy:0.5")
    with pytest.raises(ValueError, match="unknown attack"):
        parse_attack_spec("bribe:0.1")


def test_a_boosting_attacker_sends_just_under_the_norm_bound_and_a_zero_update_stays_zero():
    update = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0]), "steps": torch.tensor([2])}
    boosted = boost_to_bound(update, 8.0)
    norm = float(torch.cat([boosted["w"], boosted["b"]]).norm())
    assert norm == pytest.approx(BOUND_SHARE * 8.0) and norm <= 8.0
    assert torch.equal(boosted["steps"], update["steps"])
    assert torch.allclose(boosted["w"] / boosted["w"].norm(), update["w"] / update["w"].norm())
    zero = {"w": torch.zeros(2)}
    assert torch.equal(boost_to_bound(zero, 8.0)["w"], zero["w"])
    assert {n for n in ("sign_flip", "gaussian", "backdoor") if get_attack(n).boosts} == {
        "sign_flip",
        "gaussian",
        "backdoor",
    }
