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


# ---------------------------------------------------------------- targeted families (issue 34)

from fl_node.attacks import (  # noqa: E402
    BLEND,
    EDGE_ANGLE,
    POISON_RATE,
    REPLACEMENT_SCALE,
    SCALE,
    TARGETED_FAMILIES,
    TRIGGER_PIXELS,
    TRIGGER_SHAPES,
    constrain_to_bound,
    draw_targeted,
)


def _digits(n: int = 200, *, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 0.6, size=(n, 1, 12, 12)).astype(np.float32)
    return ArrayDataset(x, (np.arange(n) % 10).astype(np.int64))


def _draw(family: str, seed: int, pool: ArrayDataset | None = None):
    return draw_targeted(family, seed=seed, input_shape=(1, 12, 12), num_classes=10, pool=pool)


def test_every_family_draws_its_parameters_from_the_run_seed_within_the_stated_ranges():
    shapes = set()
    for family in TARGETED_FAMILIES:
        draws = [_draw(family, seed) for seed in range(40)]
        assert [d.params for d in draws] == [_draw(family, seed).params for seed in range(40)]  # per seed
        assert len({tuple(sorted(d.params.items())) for d in draws}) > 30  # ...and not one setting
        for d in draws:
            assert POISON_RATE[0] <= d.poison_rate <= POISON_RATE[1] and 0 <= d.target < 10
            low, high = REPLACEMENT_SCALE if family == "replacement" else SCALE
            assert d.scale == 1.0 and family != "replacement" or low <= d.scale <= high
            if family in ("trigger", "replacement"):
                assert TRIGGER_PIXELS[0] <= d.params["size"] <= TRIGGER_PIXELS[1]
                assert BLEND[0] <= d.params["blend"] <= BLEND[1]
                shapes.add(d.params["shape"])
            if family in ("pair_flip", "edge_case"):
                assert d.source != d.target
            if family == "edge_case":
                assert EDGE_ANGLE[0] <= abs(d.angle) <= EDGE_ANGLE[1]
        scaled = [d.scale != 1.0 for d in draws]
        assert any(scaled) and (family == "replacement" or not all(scaled))  # with and without scaling
    assert shapes == set(TRIGGER_SHAPES)
    with pytest.raises(ValueError, match="unknown targeted family"):
        _draw("bribe", 0)


def test_a_trigger_attacker_stamps_its_drawn_rate_of_examples_inside_the_mask_and_relabels_them():
    data = _digits()
    drawn = _draw("trigger", 3)
    poisoned = drawn.attacker(0, 1).poison_data(data, 10)
    changed = np.flatnonzero((poisoned.x != data.x).reshape(len(data), -1).any(axis=1))
    assert len(changed) == round(drawn.poison_rate * len(data))
    assert (poisoned.y[changed] == drawn.target).all()
    untouched = np.setdiff1d(np.arange(len(data)), changed)
    assert np.array_equal(poisoned.y[untouched], data.y[untouched])
    (trigger,) = drawn.triggers
    outside = ~np.broadcast_to(trigger.mask, poisoned.x.shape[1:])
    assert np.array_equal(poisoned.x[:, outside], data.x[:, outside])
    # The same attacker poisons the same examples every round (its draws are its own, seeded).
    assert np.array_equal(drawn.attacker(0, 1).poison_data(data, 10).x, poisoned.x)


def test_dba_attackers_stamp_disjoint_parts_whose_union_is_the_global_trigger():
    drawn = _draw("dba", 5)
    glob = drawn.global_trigger()
    for count in (1, 2, 3, 4):
        masks = [drawn._trigger_of(rank, count).mask for rank in range(count)]
        assert np.array_equal(np.logical_or.reduce(masks), glob.mask)
        if count > 1:
            assert not any((masks[i] & masks[j]).any() for i in range(count) for j in range(i + 1, count))
    # Success is measured with the whole trigger, which no attacker of several ever stamps.
    probe = drawn.probe(_digits(50))
    assert (probe[:, 0][:, glob.mask] != 0).any()


def test_a_pair_flip_relabels_only_its_source_class_and_success_is_source_inputs_sent_to_the_target():
    data = _digits()
    drawn = _draw("pair_flip", 2)
    poisoned = drawn.attacker(0, 2).poison_data(data, 10)
    flipped = np.flatnonzero(poisoned.y != data.y)
    assert (data.y[flipped] == drawn.source).all() and (poisoned.y[flipped] == drawn.target).all()
    assert len(flipped) == round(drawn.poison_rate * (data.y == drawn.source).sum())
    assert np.array_equal(poisoned.x, data.x)

    class Says(torch.nn.Module):
        def __init__(self, label: int):
            super().__init__()
            self.label = label

        def forward(self, x):
            return torch.nn.functional.one_hot(torch.full((len(x),), self.label), 10).float()

    test = _digits(100, seed=1)
    assert drawn.success(Says(drawn.target), test) == 1.0
    assert drawn.success(Says(drawn.source), test) == 0.0


def test_an_edge_case_attacker_adds_rotated_inputs_of_the_source_class_from_its_pool():
    pool = _digits(300, seed=2)
    drawn = _draw("edge_case", 4, pool=pool)
    data = _digits()
    poisoned = drawn.attacker(1, 3).poison_data(data, 10)
    changed = np.flatnonzero((poisoned.x != data.x).reshape(len(data), -1).any(axis=1))
    assert len(changed) == round(drawn.poison_rate * len(data))
    assert (poisoned.y[changed] == drawn.target).all()
    from scipy.ndimage import rotate

    rotated = rotate(pool.x[pool.y == drawn.source], drawn.angle, axes=(2, 3), reshape=False, order=1)
    for row in changed[:5]:  # each one a rotated pool image of the source class
        assert np.isclose(rotated, poisoned.x[row]).reshape(len(rotated), -1).all(axis=1).any()
    assert len(drawn.probe(pool)) == (pool.y == drawn.source).sum()


def test_a_targeted_attacker_scales_by_its_draw_and_stays_inside_the_job_bound():
    drawn = next(d for d in (_draw("trigger", s) for s in range(20)) if d.scale != 1.0)
    attack = drawn.attacker(0, 1)
    update = {"w": torch.tensor([3.0, 4.0]), "steps": torch.tensor([2])}
    sent = attack.poison_update(update, torch.Generator())
    assert torch.allclose(sent["w"], update["w"] * drawn.scale) and torch.equal(
        sent["steps"], update["steps"]
    )
    assert attack.bounded and attack.targeted
    inside = constrain_to_bound(sent, 8.0)
    assert float(inside["w"].norm()) == pytest.approx(BOUND_SHARE * 8.0)
    assert constrain_to_bound(update, 8.0) is update  # a short update is sent as it is
    plain = next(d for d in (_draw("trigger", s) for s in range(20)) if d.scale == 1.0)
    assert plain.attacker(0, 1).poison_update is None


def test_registered_families_poison_with_the_draw_of_seed_zero():
    data = _digits()
    for family in TARGETED_FAMILIES:
        attack = get_attack(family)
        assert attack.targeted and attack.bounded
        expected = _draw(family, 0).attacker(0, 1).poison_data(data, 10)
        assert np.array_equal(attack.poison_data(data, 10).y, expected.y)
    assert parse_attack_spec("dba:0.3")[0].name == "dba"
