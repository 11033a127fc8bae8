"""The engine's defenses against a hostile minority (fl_node.robust) and the simulator applying them."""

import json
import math

import pytest
import torch

from fl_node.aggregate import WeightedUpdate, available_strategies
from fl_node.attacks import BOUND_SHARE, INFLATED_SAMPLES
from fl_node.committee import MAX_SCORE, decide_round
from fl_node.job.scoring import ScoringRule
from fl_node.robust import (
    RoundDefense,
    apply_sign_majority,
    cap_samples,
    clip_update,
    colluding_scores,
    first_by_hash,
    get_strategy,
    median_norm,
    scale_step,
    sign_majority_mask,
    update_norm,
    verified_share,
    within_norm_bound,
)
from fl_node.score import BASE_SCORE
from fl_node.simulate import prepared_model_and_data, run_simulation, simulation


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


def _run(
    *,
    defense: str | None = None,
    score_relative: bool = False,
    score_scale: float = 1.0,
    score_clipped: bool = False,
    clip_to_median: bool = False,
    sign_vote: str | None = None,
    verified_step: bool = False,
    backed_magnitude: bool = False,
    **overrides,
):
    """A small federation on digits (exact scores, SGD at lr 0.5). Its job is the node's JobConfig;
    without a named ``defense`` each test names the defenses it exercises, given to the simulator as
    the scoring rule and the aggregation's defenses (what a named defense sets together)."""
    fields = dict(nodes=5, partition="iid", rounds=2, public_holdouts=True, seed=3, committee_size=1, lr=0.5)
    fields |= overrides
    fields.setdefault("top_k", max(1, fields["nodes"] - fields["committee_size"] - 1))
    if defense is not None:
        fields["defense"] = defense
        config = simulation("digits", **fields)
    else:
        fields["defense"] = "none"  # the job's own; the test's knobs below replace it
        config = simulation("digits", **fields)
        job = config.job
        config = simulation(
            "digits",
            **fields,
            custom_scoring=ScoringRule(
                metric=job.score_metric,
                relative=score_relative,
                scale=score_scale,
                clip_to_median=score_clipped,
                norm_bound=job.norm_bound or None,
                margin=job.margin_bp,
            ),
            custom_defense=RoundDefense(
                top_k=job.top_k,
                norm_bound=job.norm_bound or None,
                clip_to_median=clip_to_median,
                sign_vote=sign_vote,
                verified_step=verified_step,
                backed_magnitude=backed_magnitude,
                max_share_bp=job.max_share_bp,
            ),
        )
    return run_simulation(config, randomness_secret=b"robustness tests' own secret")


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
    fresh = _run(norm_bound=0.0, rounds=1)
    assert any(u.accepted for u in fresh.rounds[0].updates)


@pytest.mark.parametrize("attack", ["free_rider", "disguised_free_rider"])
def test_with_a_margin_a_free_rider_never_beats_the_base_model(attack):
    result = _run(attack=f"{attack}:0.2", margin_bp=0)
    riders = [u for r in result.rounds for u in r.updates if u.attacker]
    assert riders and not any(u.accepted for u in riders)


def test_a_disguised_free_rider_sends_tiny_noise_not_zeros():
    from fl_node.attacks import DISGUISE_STD, get_attack

    rider = get_attack("disguised_free_rider")
    assert not rider.trains
    update = {"w": torch.zeros(10_000), "n": torch.tensor([3])}
    sent = rider.poison_update(update, torch.Generator().manual_seed(0))
    assert bool(sent["w"].ne(0).all()) and torch.equal(sent["n"], update["n"])
    assert float(sent["w"].std()) == pytest.approx(DISGUISE_STD, rel=0.05)


def test_one_colluder_on_a_committee_of_three_cannot_carry_its_accomplice():
    # seed 3: attackers are nodes 1 (on the first committee, 0-2) and 4 (a trainer).
    result = _run(attack="sign_flip:0.34", nodes=6, committee_size=3, top_k=1, collude=True, rounds=1, seed=3)
    assert result.attackers == [1, 4]
    first = result.rounds[0]
    accomplice = next(u for u in first.updates if u.trainer == 4)
    assert not accomplice.accepted and accomplice.median < MAX_SCORE
    assert [u.trainer for u in first.updates if u.accepted] != [4]


def test_one_colluder_makes_a_median_the_better_honest_score_and_a_margin_asks_that_for_a_clear_gain():
    # Members c (colluding), h1, h2 (honest, relative scores). The colluder tops its accomplice a and
    # zeroes the honest trainer b: a's median is the better honest score, b's the worse one. At margin 0
    # a borderline accomplice (one honest member sees +60 bp, the other -40) is accepted; at 100 bp it is
    # not, while an honest update both honest members see gain clearly still is (bench/robustness.py).
    a, b = "0x" + "a" * 40, "0x" + "b" * 40
    scores = {
        "c": {a: MAX_SCORE, b: 0},
        "h1": {a: BASE_SCORE + 60, b: BASE_SCORE + 300},
        "h2": {a: BASE_SCORE - 40, b: BASE_SCORE + 250},
    }
    base = dict.fromkeys(scores, BASE_SCORE)
    loose = decide_round([a, b], scores, top_k=2, base_scores=base, margin=0)
    assert loose.medians == {a: BASE_SCORE + 60, b: BASE_SCORE + 250}
    assert sorted(loose.accepted) == sorted([a, b])
    strict = decide_round([a, b], scores, top_k=2, base_scores=base, margin=100)
    assert strict.accepted == [b]


def test_a_captured_committee_carries_noise_through_the_median_but_not_past_the_aggregation_bound():
    # seed 1: attackers 0 and 1 hold two of the three first seats, attacker 5 trains and sends noise.
    common = dict(attack="gaussian:0.49", nodes=6, committee_size=3, top_k=3, collude=True, rounds=1, seed=1)
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


def _votes(*rows: list[float]) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor(r)} for r in rows]


def test_the_sign_vote_keeps_what_a_majority_backs_and_zeroes_what_only_a_minority_moves():
    # Coordinates: 0 backed by all; 1 a trigger weight honest data never moves (3 of 7 move it);
    # 2 backed by 4 honest against 3 contrarians; 3 split 3 to 3 with one abstaining coordinate.
    honest = _votes(*[[1.0, 0.0, 1.0, 1.0]] * 3, [1.0, 0.0, 1.0, 0.0])
    hostile = _votes(*[[1.0, 5.0, -1.0, -1.0]] * 3)
    step = {"w": torch.tensor([0.5, 2.0, 0.1, 0.2])}
    mask = sign_majority_mask(step, honest + hostile)
    assert mask["w"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert sign_majority_mask(step, honest + hostile, mode="flip")["w"].tolist() == [1.0, -1.0, 1.0, -1.0]
    # A step against the majority's direction is not backed either.
    assert sign_majority_mask({"w": -step["w"]}, honest)["w"].tolist() == [0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        sign_majority_mask(step, honest, mode="halve")


def test_all_zero_updates_abstain_and_without_voters_the_step_stays():
    riders = _votes(*[[0.0, 0.0]] * 5)
    honest = _votes([1.0, -1.0], [1.0, 1.0])
    step = {"w": torch.tensor([1.0, 1.0])}
    # Two voters: a strict majority is both; five free riders do not raise the bar.
    assert sign_majority_mask(step, riders + honest)["w"].tolist() == [1.0, 0.0]
    assert sign_majority_mask(step, riders) is None
    old, new = {"w": torch.zeros(2), "n": torch.tensor([3])}, {"w": torch.ones(2), "n": torch.tensor([4])}
    assert torch.equal(apply_sign_majority(old, new, riders)["w"], torch.ones(2))
    masked = apply_sign_majority(old, new, riders + honest)
    assert masked["w"].tolist() == [1.0, 0.0] and torch.equal(masked["n"], new["n"])


def test_relative_scores_keep_a_free_rider_out_even_with_one_colluder_seated():
    # seed 3: attackers 1 (on the first committee, 0-2) and 4 (a trainer that free rides). The
    # colluder gives its accomplice the top score and the base 0; with relative scores the two honest
    # members put the base and the free rider both at BASE_SCORE, so the median is not above the base.
    common = dict(
        nodes=6, committee_size=3, top_k=3, collude=True, rounds=1, seed=3, attack="free_rider:0.34"
    )
    result = _run(**common, margin_bp=0, score_relative=True, score_metric="likelihood", score_scale=1 / 3)
    assert result.attackers == [1, 4]
    rider = next(u for u in result.rounds[0].updates if u.trainer == 4)
    assert rider.median == BASE_SCORE and not rider.accepted


# seed 1: attackers 0 and 1 hold two of the three first seats, attacker 5 trains a backdoor and
# scales it to the norm bound; the colluders accept it alone.
CAPTURED_BOOSTED_BACKDOOR = dict(
    attack="backdoor:0.49", nodes=6, committee_size=3, top_k=3, collude=True, rounds=1, seed=1, norm_bound=4.0
)


def test_a_boosted_update_carried_by_a_captured_committee_is_clipped_and_voted_down():
    # seed 1: attackers 0 and 1 hold two of the three first seats, attacker 5 trains a backdoor and
    # scales it to the norm bound. The colluders accept it alone; honest aggregation clips it to the
    # median norm of the three submissions, and the sign vote over them drops what the honest
    # trainers do not back.
    common = CAPTURED_BOOSTED_BACKDOOR
    plain = _run(**common, adaptive_attack=True)
    clipped = _run(**common, adaptive_attack=True, clip_to_median=True)
    voted = _run(**common, adaptive_attack=True, clip_to_median=True, sign_vote="zero")
    assert plain.attackers == voted.attackers == [0, 1, 5]
    for result in (plain, clipped, voted):
        assert [u.trainer for u in result.rounds[0].updates if u.accepted] == [5]
    _, first_model = prepared_model_and_data("digits", "mlp", seed=1)
    start = first_model.state_dict()

    def moved(result):
        return math.sqrt(sum(float(((result.final_state[n] - v) ** 2).sum()) for n, v in start.items()))

    assert moved(plain) == pytest.approx(BOUND_SHARE * 4.0, rel=1e-3)  # the attacker's whole update
    assert moved(clipped) < 0.9 * moved(plain)
    assert moved(voted) < moved(clipped)


def test_a_round_that_accepts_fewer_than_top_k_applies_only_the_share_the_committee_scored():
    # The captured committee of the test above carries the boosted backdoor alone (1 of top_k 3):
    # clipped, it would move the model by the median norm; with the verified step by a third of that.
    common = CAPTURED_BOOSTED_BACKDOOR
    clipped = _run(**common, adaptive_attack=True, clip_to_median=True)
    verified = _run(**common, adaptive_attack=True, clip_to_median=True, verified_step=True)
    for result in (clipped, verified):
        assert [u.trainer for u in result.rounds[0].updates if u.accepted] == [5]
    _, first_model = prepared_model_and_data("digits", "mlp", seed=1)
    start = first_model.state_dict()
    for name, value in start.items():
        step = verified.final_state[name] - value
        assert torch.allclose(step, (clipped.final_state[name] - value) / 3, atol=1e-6)
    # A round that accepts top_k or more takes the whole step; nothing accepted takes none.
    assert verified_share(3, 3) == verified_share(5, 3) == 1.0 and verified_share(0, 4) == 0.0
    assert verified_share(1, 4) == 0.25
    for accepted, top_k in ((-1, 3), (1, 0)):
        with pytest.raises(ValueError):
            verified_share(accepted, top_k)


def test_scale_step_scales_only_the_named_tensors_and_bounds_the_share():
    old = {"w": torch.zeros(2), "b": torch.ones(1)}
    new = {"w": torch.tensor([4.0, -2.0]), "b": torch.tensor([3.0])}
    out = scale_step(old, new, ["w"], 0.25)
    assert out["w"].tolist() == [1.0, -0.5] and torch.equal(out["b"], new["b"])
    assert torch.equal(scale_step(old, new, ["w", "b"], 0.0)["b"], old["b"])
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            scale_step(old, new, ["w"], bad)


def test_the_median_norm_ignores_zero_and_non_finite_updates_and_clipping_only_shortens():
    updates = _votes([3.0, 4.0], [0.0, 0.0], [6.0, 8.0], [30.0, 40.0], [float("nan"), 1.0])
    assert median_norm(updates) == 10.0  # of 5, 10, 50: the boosted one cannot raise it
    assert median_norm(updates[:2] + updates[2:3]) == 5.0  # lower middle of 5 and 10
    assert median_norm(_votes([0.0])) is None
    clipped = clip_update({"w": torch.tensor([30.0, 40.0]), "n": torch.tensor([2])}, 10.0)
    assert torch.allclose(clipped["w"], torch.tensor([6.0, 8.0])) and torch.equal(
        clipped["n"], torch.tensor([2])
    )
    short = {"w": torch.tensor([3.0, 4.0])}
    assert torch.equal(clip_update(short, 10.0)["w"], short["w"])


def test_witnesses_count_only_where_they_are_still():
    # Three saboteurs the committee judged harmful oppose everything the two honest voters back;
    # as witnesses they cannot veto it, but where they are exactly 0 they still count against a step
    # only a minority moves (coordinate 1: one voter moves it, two witnesses and one voter do not).
    honest = _votes([1.0, 0.0], [1.0, 0.0])
    mover = _votes([1.0, 1.0])
    saboteurs = _votes(*[[-1.0, 0.0]] * 3)
    step = {"w": torch.tensor([1.0, 1.0])}
    assert sign_majority_mask(step, honest + saboteurs)["w"].tolist() == [0.0, 0.0]
    assert sign_majority_mask(step, honest + mover, witnesses=saboteurs)["w"].tolist() == [1.0, 0.0]
    assert sign_majority_mask(step, mover, witnesses=saboteurs[:0])["w"].tolist() == [1.0, 1.0]
    assert sign_majority_mask(step, [], witnesses=saboteurs) is None


def test_chain_draws_seat_the_first_committee_by_the_drawn_seed_not_by_node_order():
    from fl_node.committee import draw_committee, first_seed
    from fl_node.simulate import _chain_seed, node_address

    common = dict(nodes=6, committee_size=3, rounds=1)
    fixed = _run(**common)
    assert fixed.rounds[0].committee == [0, 1, 2]
    config = simulation(
        "digits", partition="iid", public_holdouts=True, seed=3, chain_draws=True, top_k=2, **common
    )
    seed = first_seed(_chain_seed(config, "start"), 0)
    addresses = [node_address(3, i) for i in range(6)]
    expected = [addresses.index(a) for a in draw_committee(seed, addresses, 3)]
    drawn = _run(**common, chain_draws=True)
    assert drawn.rounds[0].committee == expected
    assert expected != [0, 1, 2]  # this seed's draw is not the fixed seats
    assert _chain_seed(config, "tie", 0) != _chain_seed(config, "tie", 1)  # a fresh tie order each round


def test_absent_nodes_take_no_part_and_are_the_nodes_the_attack_would_pick():
    labelled = _run(attack="label_flip:0.4", rounds=1)
    absent = _run(attack="absent:0.4", rounds=1)
    assert labelled.attackers == [1, 3]  # seed 3's pick at 40% of 5
    assert absent.attackers == []  # nobody attacks: the attackers are simply not there
    (first,) = absent.rounds
    seen = set(first.committee) | {u.trainer for u in first.updates}
    assert seen == {0, 2, 4} and first.committee == [0]
    with pytest.raises(ValueError):
        _run(
            attack="absent:0.4", committee_size=3, rounds=1
        )  # 3 nodes left: no trainer beside a committee of 3


def _random_updates(count: int, *, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {"w": torch.randn(4, 3, generator=generator) * (i + 1), "b": torch.randn(3, generator=generator)}
        for i in range(count)
    ]


def test_defended_aggregate_is_the_bound_the_clip_the_vote_and_the_verified_step_in_turn():
    from fl_node.robust import RoundDefense, defended_aggregate, vote_signs

    state = {"w": torch.zeros(4, 3), "b": torch.ones(3), "steps": torch.tensor([5])}
    submitted = _random_updates(5, seed=7)
    submitted[3]["w"][0, 0] = float("inf")  # accepted by a captured committee: dropped, never averaged
    accepted = [WeightedUpdate(u, n, f"h{n}") for n, u in enumerate(submitted[:4], start=1)]
    defense = RoundDefense(
        top_k=4, norm_bound=50.0, clip_to_median=True, sign_vote="zero", verified_step=True
    )
    fedavg = get_strategy("fedavg")
    voters, witnesses = submitted[:3], submitted[4:]
    clip = median_norm(voters + witnesses)
    out, _ = defended_aggregate(
        fedavg,
        state,
        accepted,
        defense=defense,
        clip_norm=clip,
        voters=[vote_signs(u) for u in voters],
        witnesses=[vote_signs(u) for u in witnesses],
    )
    # The same steps one by one, with the functions the simulator used before it called this one.
    kept = [WeightedUpdate(clip_update(u.update, clip), u.num_samples, u.id) for u in accepted[:3]]
    expected, _ = fedavg.aggregate(state, kept)
    expected = apply_sign_majority(state, expected, voters, witnesses=witnesses)
    expected = scale_step(state, expected, ["b", "w"], 3 / 4)
    for name in ("w", "b"):
        assert torch.equal(out[name], expected[name])
    assert torch.equal(out["steps"], state["steps"])
    # Nothing left to combine: the model stays, with its server state.
    same, server = defended_aggregate(fedavg, state, accepted[3:], defense=defense, server_state={"m": 1})
    assert server == {"m": 1} and all(torch.equal(same[n], state[n]) for n in state)
    with pytest.raises(ValueError):
        RoundDefense(top_k=0)
    with pytest.raises(ValueError):
        RoundDefense(top_k=1, norm_bound=float("inf"))


def test_vote_roles_keep_the_updates_judged_harmful_as_witnesses_only():
    from fl_node.robust import aggregation_clip_norm, vote_roles, vote_signs

    medians = {"good": 5200, "harmful": 4800, "useless": 5000, "carried": 0, "rider": 5000}
    voters, witnesses = vote_roles(list(medians), medians, base_median=5000, margin=0)
    assert voters == ["good", "carried"] and witnesses == ["harmful", "useless", "rider"]
    # With a margin, an update must gain more than it to vote.
    assert vote_roles(["good"], medians, base_median=5000, margin=200) == ([], ["good"])
    assert vote_signs({"w": torch.zeros(3)}) is None  # an all-zero update abstains
    assert vote_signs({"w": torch.tensor([2.0, -0.5, 0.0])})["w"].tolist() == [1, -1, 0]
    assert aggregation_clip_norm([3.0, 0.0], [5.0, math.inf]) == 3.0  # lower middle of 3 and 5
    assert aggregation_clip_norm([], [0.0]) is None


def test_member_scores_are_the_clipped_relative_scores_and_zero_for_the_unusable():
    from fl_node.score import member_scores, relative_update_score, score_update

    splits, model = prepared_model_and_data("digits", "mlp", seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = splits.val.tensors()
    floats = [k for k, v in state.items() if v.is_floating_point()]
    generator = torch.Generator().manual_seed(1)
    updates = {
        f"t{i}": {k: torch.randn(state[k].shape, generator=generator) * 0.05 * (i + 1) for k in floats}
        for i in range(3)
    }
    updates["boosted"] = {k: v * 40 for k, v in updates["t0"].items()}
    updates["unreadable"] = None
    bound = 0.9 * update_norm(updates["boosted"])  # the boosted one is over the job's bound
    scores = member_scores(model, state, updates, x, y, scale=1 / 3, norm_bound=bound)
    base = score_update(
        model, state, {k: torch.zeros_like(state[k]) for k in floats}, x, y, metric="likelihood"
    )
    clip = median_norm([updates[t] for t in ("t0", "t1", "t2")])
    for trainer in ("t0", "t1", "t2"):
        expected = relative_update_score(
            model, state, updates[trainer], x, y, base_value=base, scale=1 / 3, clip_norm=clip
        )
        assert scores[trainer] == expected and 0 < expected <= MAX_SCORE
    assert scores["boosted"] == scores["unreadable"] == 0
    assert scores["t2"] == relative_update_score(  # t2 is the longest: clipped to t1's norm
        model, state, updates["t2"], x, y, base_value=base, scale=1 / 3, clip_norm=update_norm(updates["t1"])
    )
    # Without the clip, the longest update is scored at its own length.
    unclipped = member_scores(
        model, state, updates, x, y, scale=1 / 3, norm_bound=bound, clip_to_median=False
    )
    assert unclipped["t0"] == scores["t0"]  # t0 is shorter than the median: never clipped


def test_a_job_config_is_defended_by_default_and_undefended_only_by_choice():
    from fl_node.job import aggregation, scoring
    from fl_node.job.config import ConfigError, DPConfig, JobConfig

    common = dict(
        name="j",
        model="mlp",
        input_shape=(64,),
        num_classes=10,
        schema_hash="0x" + "0" * 64,
        rounds=2,
        dp=DPConfig(mode="none"),
    )
    default = JobConfig(**common)
    assert default.defense == "levelled" and default.max_share_bp == 5000
    assert b'"defense":"levelled"' in default.to_bytes() and b'"max_share_bp":5000' in default.to_bytes()
    rule = aggregation.round_defense(default)
    assert rule.backed_magnitude and rule.mix_backers and rule.level_backers and rule.step_floor == 0.75
    assert rule.sign_vote == "zero" and rule.max_share_bp == 5000
    assert not aggregation.round_defense(JobConfig(**common, defense="robust")).mix_backers
    mixing = aggregation.round_defense(JobConfig(**common, defense="mixing"))
    assert mixing.mix_backers and not mixing.level_backers and not mixing.step_floor  # it keeps its rule
    assert scoring.scoring(default).relative and scoring.scoring(default).scale == 1 / default.top_k
    for defense in ("levelled", "mixing", "robust", "committee", "none"):
        for cap in (1, 5000, 10_000):
            config = JobConfig(**common, defense=defense, max_share_bp=cap, norm_bound=8.0)
            assert JobConfig.from_bytes(config.to_bytes()) == config
    # "none" and "committee" keep the bytes jobs had before the field: no key, and "robust": true.
    none = JobConfig(**common, defense="none", max_share_bp=10_000)
    assert b"defense" not in none.to_bytes() and b"robust" not in none.to_bytes()
    assert b"max_share_bp" not in none.to_bytes()
    assert not scoring.scoring(none).relative and not aggregation.round_defense(none).needs_votes
    committee = JobConfig(**common, defense="committee", max_share_bp=10_000)
    assert b'"robust":true' in committee.to_bytes() and b"defense" not in committee.to_bytes()
    assert not aggregation.round_defense(committee).backed_magnitude
    legacy = committee.as_dict()
    assert JobConfig.from_dict(legacy).defense == "committee"
    for twice in ({**legacy, "defense": "committee"}, {**legacy, "robust": False}):
        with pytest.raises(ConfigError):
            JobConfig.from_bytes(json.dumps(twice, sort_keys=True, separators=(",", ":")).encode())
    for field, bad in (
        ("defense", "strong"),
        ("defense", None),
        ("max_share_bp", 0),
        ("max_share_bp", 10_001),
        ("max_share_bp", 0.5),
        ("max_share_bp", True),
    ):
        with pytest.raises(ConfigError) as raised:
            JobConfig(**common, **{field: bad})
        assert raised.value.field == field
    for bad in (float("nan"), float("inf"), -1.0, 1e31, True):
        with pytest.raises(ConfigError):
            JobConfig(**common, norm_bound=bad)


# ---------------------------------------------------------------- issue 34 / 32: bounded influence,
# the backed magnitude, deterministic norms, named defenses


def test_bounded_weights_water_fill_shares_under_the_cap_in_integers_whatever_the_order():
    from fractions import Fraction

    from fl_node.aggregate import bounded_weights

    def shares(samples, cap):
        weights = bounded_weights(samples, cap)
        assert all(type(w) is int and w > 0 for w in weights)
        return [Fraction(w, sum(weights)) for w in weights]

    # One member claiming 10^12 samples gets the cap, the rest share the remainder by their samples.
    assert shares([10**12, 100, 300], 5000) == [Fraction(1, 2), Fraction(1, 8), Fraction(3, 8)]
    # The largest two capped in turn, the rest proportional: 0.3, 0.3, 0.4 * (2/3, 1/3).
    assert shares([5, 3, 2, 1], 3000) == [Fraction(3, 10), Fraction(3, 10), Fraction(4, 15), Fraction(2, 15)]
    assert shares([100, 200, 300], 10_000) == [Fraction(1, 6), Fraction(1, 3), Fraction(1, 2)]  # no cap
    assert shares([7, 1], 3000) == [Fraction(1, 2)] * 2  # 2 x 30% cannot make a whole: equal shares
    assert shares([9, 1, 1], 5000) == [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)]
    order = [4, 10**9, 7, 7, 1]
    assert shares(order, 2500) == [shares(order[::-1], 2500)[i] for i in range(4, -1, -1)]
    assert max(shares([2**62, 5, 5, 5, 5], 2500)) == Fraction(1, 4)
    for bad_cap in (0, 10_001, 2.5, True):
        with pytest.raises(ValueError):
            bounded_weights([1, 2], bad_cap)
    with pytest.raises(ValueError):
        bounded_weights([1, 0], 5000)


def test_a_member_claiming_any_sample_count_cannot_make_fedavg_return_its_update():
    from fl_node.robust import RoundDefense, defended_aggregate

    state = {"w": torch.zeros(3)}
    inflated = WeightedUpdate({"w": torch.full((3,), 8.0)}, 10**12, "a-inflater")
    honest = [WeightedUpdate({"w": torch.full((3,), 1.0)}, 100, f"h{i}") for i in range(2)]
    fedavg = get_strategy("fedavg")
    unbounded, _ = defended_aggregate(fedavg, state, [inflated, *honest], defense=RoundDefense(top_k=3))
    assert torch.allclose(unbounded["w"], inflated.update["w"])  # without a cap: its update exactly
    capped, _ = defended_aggregate(
        fedavg, state, [inflated, *honest], defense=RoundDefense(top_k=3, max_share_bp=5000)
    )
    assert torch.allclose(capped["w"], torch.full((3,), 0.5 * 8.0 + 0.5 * 1.0))
    with pytest.raises(ValueError):
        RoundDefense(top_k=3, max_share_bp=0)


def test_backed_bounds_keep_a_step_within_the_voters_coordinate_median_and_never_against_it():
    from fl_node.robust import backed_bounds, clamp_step

    # Coordinates: 0 every voter moves +1 (backed up to 1); 1 three attackers of seven move +5, the
    # rest 0 (a trigger weight); 2 four honest move +0.2, three attackers +3 (a blended trigger over
    # the digits); 3 the majority moves -1 (a step of +2 goes against it).
    honest = _votes(*[[1.0, 0.0, 0.2, -1.0]] * 4)
    hostile = _votes(*[[1.0, 5.0, 3.0, -1.0]] * 3)
    bounds = backed_bounds(honest + hostile, ["w"])
    old = {"w": torch.zeros(4), "n": torch.tensor([3])}
    new = {"w": torch.tensor([0.8, 2.0, 1.5, 2.0]), "n": torch.tensor([4])}
    out = clamp_step(old, new, bounds)
    assert out["w"].tolist() == pytest.approx([0.8, 0.0, 0.2, 0.0])
    assert torch.equal(out["n"], new["n"])
    assert backed_bounds([], ["w"]) is None


def test_mixed_backers_keep_the_honest_step_a_negating_minority_would_shrink_and_divide_an_outlier():
    from fl_node.robust import backed_bounds, nearest_neighbour_mix

    # Non-IID honest updates (four of seven) that agree in sign and differ in size, and three that negate
    # one of them. The raw coordinate median is the smallest honest value; the mixes' median is an honest
    # mix (each honest update's four nearest are the honest four).
    honest = _votes([1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0])
    negating = _votes(*[[-3.0, 0.0]] * 3)
    raw = backed_bounds(honest + negating, ["w"])["w"][1]
    mixed_bounds = backed_bounds(nearest_neighbour_mix(honest + negating, ["w"]), ["w"])["w"][1]
    assert raw[0].item() == 1.0 and mixed_bounds[0].item() == pytest.approx(2.5)
    # An outlier coordinate of one attacker (a trigger weight honest data never moves) is divided by the
    # mix's size n - f (3 of 5) before any median sees it, and the median of the mixes stays 0.
    outlier = _votes([2.5, 8.0])
    mixes = nearest_neighbour_mix(honest + outlier, ["w"])
    assert len(mixes) == 5 and max(m["w"][1].item() for m in mixes) == pytest.approx(8.0 / 3)
    assert backed_bounds(mixes, ["w"])["w"][1][1].item() == 0.0
    # Fewer than three updates are not mixed; the result does not depend on the tensors' storage.
    assert [m["w"].tolist() for m in nearest_neighbour_mix(honest[:2], ["w"])] == [[1.0, 0.0], [2.0, 0.0]]


def test_exact_squared_distances_are_one_float_whatever_the_threads():
    from fl_node.robust import SUM_LANES, exact_squared_distances

    generator = torch.Generator().manual_seed(3)
    flats = [torch.randn(3 * SUM_LANES * 64 + 17, generator=generator) for _ in range(4)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = exact_squared_distances(flats)
        torch.set_num_threads(2)
        two = exact_squared_distances(flats)
    finally:
        torch.set_num_threads(before)
    assert one == two
    assert one[0][0] == 0.0 and one[1][2] == one[2][1]
    expected = float(((flats[1].double() - flats[2].double()) ** 2).sum())
    assert one[1][2] == pytest.approx(expected, rel=1e-12)


def test_backers_that_all_move_nothing_back_no_step():
    from fl_node.aggregate import get_strategy
    from fl_node.robust import DEFENSES, defended_aggregate

    state = {"w": torch.zeros(2)}
    accepted = [WeightedUpdate({"w": torch.tensor([1.0, -1.0])}, 1, "a")]
    rule = DEFENSES["levelled"].round_defense(top_k=1, norm_bound=None, max_share_bp=10_000)
    zeros = _votes([0.0, 0.0], [0.0, 0.0])
    new, _ = defended_aggregate(get_strategy("fedavg"), state, accepted, defense=rule, backers=zeros)
    assert new["w"].tolist() == [0.0, 0.0]
    unbacked, _ = defended_aggregate(get_strategy("fedavg"), state, accepted, defense=rule, backers=[])
    assert unbacked["w"].tolist() == [1.0, -1.0]  # no backers given: the backed magnitude has nothing to say


def test_a_step_floor_makes_every_coordinate_reach_that_share_of_the_backed_magnitude():
    from fl_node.robust import backed_bounds, clamp_step

    # Coordinate 0: the backers' median moves +2 and the step only +0.2 (a captured round that accepted
    # a free rider); 1: the median moves -2, the step +1 (against it); 2: the median is 0.
    backers = _votes(*[[2.0, -2.0, 0.0]] * 3)
    old = {"w": torch.zeros(3)}
    new = {"w": torch.tensor([0.2, 1.0, 0.5])}
    assert clamp_step(old, new, backed_bounds(backers, ["w"]))["w"].tolist() == pytest.approx([0.2, 0.0, 0.0])
    floored = clamp_step(old, new, backed_bounds(backers, ["w"], floor=0.75))
    assert floored["w"].tolist() == [1.5, -1.5, 0.0]
    within = {"w": torch.tensor([1.8, -1.6, 0.0])}  # inside [0.75 m, m]: as it is
    assert torch.equal(clamp_step(old, within, backed_bounds(backers, ["w"], floor=0.75))["w"], within["w"])
    with pytest.raises(ValueError, match="floor"):
        backed_bounds(backers, ["w"], floor=-0.1)


def test_the_floor_lifts_only_what_most_submissions_move():
    from fl_node.robust import backed_bounds, clamp_step, moved_by_most, vote_signs

    # Coordinate 0: every submission moves it; 1: a trigger weight that honest data never moves (the
    # four honest updates leave it at exactly 0), moved by three attackers alone.
    submissions = _votes(*[[2.0, 0.0]] * 4, *[[2.0, 3.0]] * 3)
    votes = [vote_signs(u) for u in submissions]
    assert moved_by_most(votes, ["w"])["w"].tolist() == [True, False]
    # Backers whose median reaches the trigger weight (mixes that hold an attacker): without the votes
    # the floor would lift a step the sign vote zeroed there to 3/4 of it; with them it stays at 0.
    backers = _votes(*[[2.0, 1.0]] * 3)
    old, new = {"w": torch.zeros(2)}, {"w": torch.zeros(2)}
    assert clamp_step(old, new, backed_bounds(backers, ["w"], floor=0.75))["w"].tolist() == [1.5, 0.75]
    floored = clamp_step(old, new, backed_bounds(backers, ["w"], floor=0.75, floor_votes=votes))
    assert floored["w"].tolist() == [1.5, 0.0]
    # A tie is not "most"; all-zero updates abstain (vote_signs: None) and are no votes at all.
    tie = [vote_signs(u) for u in _votes([1.0, 0.0], [0.0, 0.0001], [1.0, 0.0], [0.0, 1.0])]
    assert moved_by_most(tie, ["w"])["w"].tolist() == [False, False]
    assert vote_signs(_votes([0.0, 0.0])[0]) is None


def test_a_captured_round_gets_no_floor_on_a_weight_honest_updates_never_move():
    from fl_node.aggregate import get_strategy
    from fl_node.robust import (
        DEFENSES,
        backed_bounds,
        defended_aggregate,
        level_norms,
        nearest_neighbour_mix,
        vote_signs,
    )

    # Non-IID honest updates that never move weight 1 (a corner pixel black in every clean image),
    # three attackers near their centre that do; a captured committee accepts one accomplice.
    honest = _votes([1.0, 0.0], [4.0, 0.0], [-2.0, 0.0], [6.0, 0.0])
    attackers = _votes(*[[2.5, 0.5]] * 3)
    submissions = honest + attackers
    # Most mixes hold an attacker: their median reaches weight 1, where a floor would lift the step.
    mixes = nearest_neighbour_mix(level_norms(submissions, ["w"]), ["w"])
    assert backed_bounds(mixes, ["w"], floor=0.75)["w"][0][1].item() > 0.25
    rule = DEFENSES["levelled"].round_defense(top_k=4, norm_bound=None, max_share_bp=10_000)
    accomplice = [WeightedUpdate(attackers[0], 1, "accomplice")]
    votes = [vote_signs(u) for u in submissions]
    new, _ = defended_aggregate(
        get_strategy("fedavg"),
        {"w": torch.zeros(2)},
        accomplice,
        defense=rule,
        voters=votes,
        backers=submissions,
    )
    assert new["w"][1].item() == 0.0  # the sign vote refused it, and the floor does not undo that
    assert new["w"][0].item() == pytest.approx(0.75 * backed_bounds(mixes, ["w"])["w"][1][0].item())
    # Judging the honest updates harmful (witnesses) changes neither: roles do not enter the floor.
    judged, _ = defended_aggregate(
        get_strategy("fedavg"),
        {"w": torch.zeros(2)},
        accomplice,
        defense=rule,
        voters=votes[4:],
        witnesses=votes[:4],
        backers=submissions,
    )
    assert torch.equal(judged["w"], new["w"])


def test_a_mixing_defense_needs_the_backed_magnitude():
    from fl_node.robust import RoundDefense

    with pytest.raises(ValueError, match="needs backed_magnitude"):
        RoundDefense(top_k=3, mix_backers=True)
    with pytest.raises(ValueError, match="needs backed_magnitude"):
        RoundDefense(top_k=3, level_backers=True)
    with pytest.raises(ValueError, match="needs backed_magnitude"):
        RoundDefense(top_k=3, step_floor=0.5)
    with pytest.raises(ValueError, match="step_floor"):
        RoundDefense(top_k=3, backed_magnitude=True, step_floor=1.5)


def test_levelled_backers_leave_out_zeros_and_lengthen_what_a_free_riding_minority_shortens():
    from fl_node.robust import LEVEL_FLOOR, backed_bounds, level_norms, nearest_neighbour_mix

    def backed(updates):  # the high bound of coordinate 0 over the updates' mixes
        return backed_bounds(nearest_neighbour_mix(updates, ["w"]), ["w"])["w"][1][0].item()

    # Four honest non-IID updates of seven, and three free riders: zero (plain) or tiny (disguised).
    honest = _votes([1.0, 0.0], [2.0, 1.0], [3.0, -1.0], [4.0, 0.5])
    zeros = _votes(*[[0.0, 0.0]] * 3)
    tiny = _votes([1e-4, -1e-4], [-1e-4, 2e-4], [1e-4, 1e-4])
    # Unlevelled, each honest update's four nearest take in the riders: the bound falls to a tenth.
    assert backed(honest) == pytest.approx(2.5) and backed(honest + zeros) == pytest.approx(0.25)
    # Zeros abstain: the backers are the honest ones alone (levelled among themselves).
    alone = level_norms(honest, ["w"])
    assert [u["w"].tolist() for u in level_norms(honest + zeros, ["w"])] == [u["w"].tolist() for u in alone]
    assert backed(level_norms(honest + zeros, ["w"])) == backed(alone) > 2.5
    # Tiny ones count with their direction at LEVEL_FLOOR of the median norm: the bound shrinks less.
    assert backed(level_norms(honest + tiny, ["w"])) > backed(honest + tiny) * 1.4
    levelled = level_norms(honest + _votes([3e-4, -4e-4]), ["w"])
    median = math.hypot(2.0, 1.0)  # the lower middle of the five norms
    assert torch.allclose(levelled[-1]["w"], torch.tensor([0.6, -0.8]) * LEVEL_FLOOR * median)
    # An update shorter than the floor is lengthened to it; nothing at or above it changes.
    assert torch.allclose(levelled[0]["w"], torch.tensor([LEVEL_FLOOR * median, 0.0]))
    assert all(torch.equal(a["w"], b["w"]) for a, b in zip(levelled[1:4], honest[1:4], strict=True))
    assert level_norms(_votes([0.0, 0.0]), ["w"]) == [] and level_norms([], ["w"]) == []
    with pytest.raises(ValueError, match="floor"):
        level_norms(honest, ["w"], floor=1.5)


def test_the_default_defense_keeps_a_free_riding_minoritys_round_at_the_honest_step():
    from fl_node.aggregate import get_strategy
    from fl_node.robust import DEFENSES, defended_aggregate

    state = {"w": torch.zeros(2)}
    honest = _votes([1.0, 0.0], [2.0, 1.0], [3.0, -1.0], [4.0, 0.5])
    accepted = [WeightedUpdate(h, 1, str(i)) for i, h in enumerate(honest)]

    def step(defense, riders):
        rule = DEFENSES[defense].round_defense(top_k=4, norm_bound=None, max_share_bp=5000)
        new, _ = defended_aggregate(
            get_strategy("fedavg"), state, accepted, defense=rule, clip_norm=10.0, backers=honest + riders
        )
        return new["w"][0].item()

    # The honest average moves coordinate 0 by 2.5; three zero riders' mixes cap it at 0.25.
    zeros = _votes(*[[0.0, 0.0]] * 3)
    assert step("levelled", zeros) == pytest.approx(2.5) and step("mixing", zeros) == pytest.approx(0.25)
    tiny = _votes([1e-4, -1e-4], [-1e-4, 2e-4], [1e-4, 1e-4])
    assert step("levelled", tiny) > 1.4 * step("mixing", tiny)


def test_with_the_backed_magnitude_a_captured_round_applies_no_more_than_the_honest_majority_backs():
    from fl_node.robust import RoundDefense, defended_aggregate, median_norm

    state = {"w": torch.zeros(4)}
    honest = [{"w": torch.tensor([0.5, 0.0, 0.1, 0.3])} for _ in range(5)]
    attacker = {"w": torch.tensor([0.5, 3.0, 2.0, -1.0])}
    carried = [WeightedUpdate(attacker, 10, "attacker")]  # all a captured committee accepted
    defense = RoundDefense(top_k=1, backed_magnitude=True)
    voters = [*honest, attacker]  # a hostile majority's 0 for an honest update still lets it vote
    out, _ = defended_aggregate(get_strategy("fedavg"), state, carried, defense=defense, backers=voters)
    assert out["w"].tolist() == pytest.approx([0.5, 0.0, 0.1, 0.0])
    # The backers are clipped to the round's clip norm first, as the accepted updates are.
    clip = median_norm(voters)
    clipped, _ = defended_aggregate(
        get_strategy("fedavg"),
        state,
        carried,
        defense=RoundDefense(top_k=1, backed_magnitude=True, clip_to_median=True),
        clip_norm=clip,
        backers=voters,
    )
    assert float(clipped["w"].abs().max()) <= clip + 1e-6 and clipped["w"][1] == 0.0


def test_update_norms_are_summed_in_one_fixed_order_on_every_machine():
    from fl_node.robust import SUM_LANES, exact_order_sum

    generator = torch.Generator().manual_seed(2)
    values = torch.randn(3 * SUM_LANES + 17, generator=generator, dtype=torch.float64)
    padded = torch.nn.functional.pad(values, (0, (-values.numel()) % SUM_LANES)).view(-1, SUM_LANES)
    lanes = padded[0] + padded[1]
    lanes = lanes + padded[2]
    lanes = lanes + padded[3]
    assert exact_order_sum(values) == math.fsum(lanes.tolist())
    assert exact_order_sum(torch.zeros(0, dtype=torch.float64)) == 0.0
    # A float32 squared is exact in float64: a norm of exactly representable squares is exact.
    assert update_norm({"w": torch.full((SUM_LANES * 2 + 3,), 0.5)}) == math.sqrt((SUM_LANES * 2 + 3) / 4)
    # The same bits whatever torch's intra-op threads (torch's own sum may change association order).
    big = {"w": torch.randn(200_000, generator=generator)}
    before = torch.get_num_threads()
    try:
        norms = set()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            norms.add(update_norm(big))
    finally:
        torch.set_num_threads(before)
    assert len(norms) == 1


def test_named_defenses_set_the_simulators_scoring_and_aggregation_through_the_job():
    from fl_node.robust import DEFAULT_DEFENSE, DEFENSES, get_defense

    assert DEFAULT_DEFENSE == "levelled"
    assert set(DEFENSES) == {"levelled", "mixing", "robust", "committee", "none"}
    config = simulation("digits", nodes=10, committee_size=3, top_k=4, rounds=1)
    assert config.job.defense == "levelled" and config.defense.mix_backers and config.defense.level_backers
    rule, defense = config.scoring, config.defense  # fl_node.job's, as a node derives them
    assert rule.relative and rule.clip_to_median and rule.scale == 0.25 and rule.margin == 0
    assert defense.clip_to_median and defense.verified_step and defense.sign_vote == "zero"
    assert defense.backed_magnitude and defense.max_share_bp == 5000
    committee = simulation("digits", defense="committee", margin_bp=100, rounds=1)
    assert (
        committee.scoring.relative
        and not committee.defense.backed_magnitude
        and committee.scoring.margin == 100
    )
    plain = simulation("digits", defense="none", rounds=1)
    assert not plain.scoring.relative and plain.defense.sign_vote is None and plain.scoring.margin == 0
    with pytest.raises(ValueError, match="must be one of levelled, mixing"):
        simulation("digits", defense="strong", rounds=1)
    with pytest.raises(ValueError, match="basis points"):
        simulation("digits", max_share_bp=0, rounds=1)
    with pytest.raises(ValueError, match="unknown defense"):
        get_defense("flame")
    rule = get_defense("robust").round_defense(top_k=4, norm_bound=None, max_share_bp=5000)
    assert rule.backed_magnitude and rule.sign_vote == "zero" and rule.needs_votes


def test_a_captured_committee_carries_less_of_a_boosted_backdoor_with_the_backed_magnitude():
    # The captured round of test_a_boosted_update_carried_by_a_captured_committee_is_clipped_and_voted_down:
    # the colluders accept the boosted backdoor alone; with the backed magnitude the applied step is also
    # bounded by the coordinate median of the round's three submissions (two of them honest).
    common = CAPTURED_BOOSTED_BACKDOOR
    knobs = dict(adaptive_attack=True, clip_to_median=True, sign_vote="zero")
    voted = _run(**common, **knobs)
    backed = _run(**common, **knobs, backed_magnitude=True)
    default = _run(
        **(common | {"defense": "robust", "margin_bp": 0, "score_metric": "likelihood"}), adaptive_attack=True
    )
    for result in (voted, backed, default):
        assert [u.trainer for u in result.rounds[0].updates if u.accepted] == [5]
    _, first_model = prepared_model_and_data("digits", "mlp", seed=1)
    start = first_model.state_dict()

    def moved(result):
        return math.sqrt(sum(float(((result.final_state[n] - v) ** 2).sum()) for n, v in start.items()))

    assert 0 < moved(backed) < 0.8 * moved(voted)
    assert 0 < moved(default) < moved(backed)  # the verified step too: 1 of top_k 3, then the bound


def test_a_noisy_relative_score_forgives_the_noise_and_an_exact_one_nothing():
    from fl_node.score import LOSS_CLIP, NOISE_TOLERANCE, noise_allowance, relative_score_int

    assert noise_allowance(0.9, metric="accuracy", noise_multiplier=None, records=40) == 0.0
    assert noise_allowance(0.9, metric="accuracy", noise_multiplier=4.0, records=80) == pytest.approx(
        NOISE_TOLERANCE * math.sqrt(2) * 4.0 / 80
    )
    assert noise_allowance(0.5, metric="likelihood", noise_multiplier=2.0, records=100) == pytest.approx(
        NOISE_TOLERANCE * math.sqrt(2) * 0.5 * 2.0 * LOSS_CLIP / 100
    )
    with pytest.raises(ValueError):
        noise_allowance(0.5, metric="accuracy", noise_multiplier=1.0, records=0)
    # An update the noise alone put 100 bp under the base still clears the base with an allowance of
    # 150 bp; without noise (no allowance) it does not, and a malformed update scores 0 either way.
    assert relative_score_int(0.49, 0.50) == BASE_SCORE - 100
    assert relative_score_int(0.49, 0.50, 0.015) == BASE_SCORE + 50
    assert relative_score_int(0.0, 0.50, 0.015) == 0
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            relative_score_int(0.49, 0.50, bad)


def test_member_scores_add_the_allowance_only_to_noisy_scores():
    from fl_node.score import member_scores
    from fl_node.secure_random import SecureRandom

    splits, model = prepared_model_and_data("digits", "mlp", seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = splits.val.tensors()
    generator = torch.Generator().manual_seed(3)
    updates = {
        f"t{i}": {k: torch.randn(v.shape, generator=generator) * 0.05 for k, v in state.items()}
        for i in range(3)
    }
    exact = member_scores(model, state, updates, x, y, scale=1 / 3, metric="accuracy")
    zero = {k: torch.zeros_like(v) for k, v in state.items()}
    rider = member_scores(model, state, {"rider": zero}, x, y, scale=1 / 3, metric="accuracy")
    assert rider == {"rider": BASE_SCORE}  # exact: a free rider gains exactly nothing
    secret = b"member noise, fixed for the test"

    def stream(key):
        return SecureRandom.derive(secret, str(key))

    noisy = member_scores(
        model,
        state,
        {"rider": zero},
        x,
        y,
        scale=1 / 3,
        metric="accuracy",
        noise_multiplier=0.5,
        randomness=stream,
        records=len(x),
    )
    # The rider's and the base's noise differ, but by far less than the allowance (2 sqrt 2 sigma).
    assert noisy["rider"] > BASE_SCORE
    assert all(0 < s <= 10_000 for s in exact.values())
