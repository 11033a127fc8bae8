"""The engine's defenses against a hostile minority (fl_node.robust) and the simulator applying them."""

import math

import pytest
import torch

from fl_node.aggregate import WeightedUpdate, available_strategies
from fl_node.attacks import INFLATED_SAMPLES
from fl_node.committee import MAX_SCORE
from fl_node.robust import (
    cap_samples,
    colluding_scores,
    first_by_hash,
    get_strategy,
    update_norm,
    within_norm_bound,
)
from fl_node.simulate import SimulationConfig, prepared_model_and_data, run_simulation


def test_update_norm_is_the_l2_norm_of_float_tensors_and_inf_when_not_finite():
    update = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0]), "steps": torch.tensor([7])}
    assert update_norm(update) == 5.0
    assert within_norm_bound(update, 5.0) and not within_norm_bound(update, 4.99)
    assert within_norm_bound(update, None)
    for bad in (float("nan"), float("inf")):
        poisoned = {"w": torch.tensor([1.0, bad])}
        assert math.isinf(update_norm(poisoned))
        assert not within_norm_bound(poisoned, None)


def test_samples_are_capped_at_the_registered_size_and_must_be_positive():
    assert cap_samples(INFLATED_SAMPLES, 120) == 120
    assert cap_samples(80, 120) == 80
    with pytest.raises(ValueError):
        cap_samples(0, 120)


def test_the_first_submission_of_a_hash_is_kept_and_later_repeats_dropped():
    kept, dropped = first_by_hash([("a", "h1"), ("b", "h2"), ("copier", "h1"), ("c", "h3"), ("again", "h2")])
    assert kept == ["a", "b", "c"] and dropped == ["copier", "again"]


def test_colluders_score_accomplices_top_and_the_rest_zero():
    assert colluding_scores(["x", "y"], {"y"}) == {"x": 0, "y": MAX_SCORE}


def _updates(values: list[float]) -> list[WeightedUpdate]:
    return [WeightedUpdate({"w": torch.full((3,), v)}, 1, f"u{i}") for i, v in enumerate(values)]


def test_adaptive_multi_krum_drops_the_outlier_of_few_updates_and_averages_two():
    strategy = get_strategy("multi_krum_adaptive")
    zero = {"w": torch.zeros(3)}
    state, _ = strategy.aggregate(zero, _updates([1.0, 1.0, 1.0, 100.0]))
    assert torch.equal(state["w"], torch.ones(3))
    state, _ = strategy.aggregate(zero, _updates([1.0, 3.0]))
    assert torch.equal(state["w"], torch.full((3,), 2.0))
    assert "multi_krum_adaptive" not in available_strategies()  # simulations only, not a job's choice
    assert get_strategy("median").name == "median"


def _run(**overrides):
    config = dict(
        dataset="digits", nodes=5, committee=1, partition="iid", rounds=2, score_privacy="public", seed=3
    )
    return run_simulation(
        SimulationConfig(**(config | overrides)), randomness_secret=b"robustness tests' own secret"
    )


def test_a_copied_update_counts_once_and_the_copier_gets_nothing():
    result = _run(attack="copy:0.2")
    for record in result.rounds:
        copiers = [u for u in record.updates if u.attacker]
        honest = {u.content_hash for u in record.updates if not u.attacker}
        for copier in copiers:
            assert copier.content_hash in honest  # it did copy someone
            assert not copier.accepted and copier.median == 0 and copier.num_samples == 0
    assert any(u.attacker for r in result.rounds for u in r.updates)


def test_an_inflated_sample_count_is_capped_by_the_committee_and_not_by_plain_fedavg():
    capped = _run(attack="inflate:0.2", top_k=4)  # every trainer accepted: only the cap protects
    claims = [u for r in capped.rounds for u in r.updates if u.attacker]
    assert claims and all(0 < u.num_samples < 1000 for u in claims)
    undefended = _run(attack="inflate:0.2", consensus=False)
    claims = [u for r in undefended.rounds for u in r.updates if u.attacker]
    assert claims and all(u.num_samples == INFLATED_SAMPLES and u.accepted for u in claims)
    assert undefended.final_accuracy < capped.final_accuracy


def test_an_update_over_the_norm_bound_scores_zero_and_the_model_stays():
    result = _run(norm_bound=1e-6, rounds=1)
    assert all(u.median == 0 and not u.accepted for u in result.rounds[0].updates)
    fresh = _run(norm_bound=None, rounds=1)
    assert any(u.accepted for u in fresh.rounds[0].updates)


def test_with_a_margin_a_free_rider_never_beats_the_base_model():
    result = _run(attack="free_rider:0.2", margin=0)
    riders = [u for r in result.rounds for u in r.updates if u.attacker]
    assert riders and not any(u.accepted for u in riders)


def test_one_colluder_on_a_committee_of_three_cannot_carry_its_accomplice():
    # seed 3: attackers are nodes 1 (on the first committee, 0-2) and 4 (a trainer).
    result = _run(attack="sign_flip:0.34", nodes=6, committee=3, top_k=1, collude=True, rounds=1, seed=3)
    assert result.attackers == [1, 4]
    first = result.rounds[0]
    accomplice = next(u for u in first.updates if u.trainer == 4)
    assert not accomplice.accepted and accomplice.median < MAX_SCORE
    assert [u.trainer for u in first.updates if u.accepted] != [4]


def test_a_captured_committee_carries_noise_through_the_median_but_not_past_the_aggregation_bound():
    # seed 1: attackers 0 and 1 hold two of the three first seats, attacker 5 trains and sends noise.
    common = dict(attack="gaussian:0.49", nodes=6, committee=3, top_k=3, collude=True, rounds=1, seed=1)
    bounded = _run(**common, norm_bound=1.0)
    assert bounded.attackers == [0, 1, 5]
    noise = next(u for u in bounded.rounds[0].updates if u.trainer == 5)
    assert noise.accepted and noise.median == MAX_SCORE  # the colluding majority carried it
    unbounded = _run(**common)
    _, first_model = prepared_model_and_data("digits", "mlp", seed=1)
    untouched = first_model.state_dict()
    # The honest trainers got 0 from the colluders, so the noise was all that was accepted: the bound
    # at aggregation drops it and the model stays; without a bound the noise is the new model.
    assert all(not u.accepted for u in bounded.rounds[0].updates if not u.attacker)
    for name, value in untouched.items():
        assert torch.equal(bounded.final_state[name], value)
    assert any(not torch.equal(unbounded.final_state[n], v) for n, v in untouched.items())
