"""The reference committee rule on hand-made rounds."""

import pytest

from fl_node.committee import (
    decide_round,
    draw_committee,
    first_seed,
    median_score,
    mix_in,
    round_seed,
    score_to_int,
    skip_seed,
)

A, B, C, D, E = (f"0x{i:040x}" for i in (0xA, 0xB, 0xC, 0xD, 0xE))


def test_median_odd_even_and_empty():
    assert median_score([3, 1, 2]) == 2
    assert median_score([1, 4]) == 1  # the lower of the middle pair
    assert median_score([0, 10_000]) == 0  # one colluder against one honest seat carries nothing
    assert median_score([9, 1, 7, 3]) == 3
    assert median_score([]) == 0


def test_score_to_int_maps_accuracy_and_rejects_nan():
    assert score_to_int(0.9123) == 9123
    assert score_to_int(float("nan")) == 0
    assert score_to_int(1.5) == 10_000


def test_top_k_by_median_with_zero_scores_never_accepted():
    scores = {
        D: {A: 9000, B: 100, C: 0},
        E: {A: 8000, B: 9500, C: 0},
    }
    out = decide_round([A, B, C], scores, top_k=3)
    # two seats: the lower score counts, so B (one member's 100) is ranked but not carried by E alone
    assert out.medians == {A: 8000, B: 100, C: 0}
    assert out.accepted == [A, B]


def test_ties_are_broken_by_the_round_seed_not_by_the_address():
    """Equal medians go by keccak(seed, 0, address), smaller first: no address wins every tie."""
    from eth_utils import keccak

    scores = {D: {C: 7000, A: 7000, B: 7000}}
    firsts = set()
    for seed in (bytes(32), b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, b"\x04" * 32, b"\x05" * 32):
        out = decide_round([C, B, A], scores, top_k=2, seed=seed)
        order = sorted([A, B, C], key=lambda t: keccak(seed + bytes(32) + bytes(12) + bytes.fromhex(t[2:])))
        assert out.ranking == order and out.accepted == order[:2]
        firsts.add(out.ranking[0])
    assert len(firsts) > 1  # another seed, another winner of the tie (6 seeds, 3 candidates)
    with pytest.raises(ValueError):
        decide_round([A], scores, top_k=1, seed=b"short")


def test_a_missing_committee_member_is_ignored():
    scores = {D: {A: 5000}}
    out = decide_round([A], scores, top_k=1)
    assert out.accepted == [A]


def test_committees_are_drawn_from_the_seed_whatever_the_scores():
    """The next committee does not follow the ranking: who scored best has no seat for it."""
    everyone = [A, B, C, D, E]
    seeds = [round_seed(first_seed(mix_in(bytes(32), b"s" * 32, A), 1), bytes(32), r) for r in range(1, 9)]
    drawn = [draw_committee(seed, everyone, 2) for seed in seeds]
    assert all(len(set(d)) == 2 and set(d) <= set(everyone) for d in drawn)
    assert len({tuple(d) for d in drawn}) > 2  # eight seeds, several committees
    # a banned participant sits only when too few others are left
    assert all(A not in draw_committee(seed, everyone, 4, banned=[A]) for seed in seeds)
    assert draw_committee(seeds[0], [A, B], 2, banned=[A])[1] == A
    assert skip_seed(seeds[0]) != seeds[0] and len(skip_seed(seeds[0])) == 32
    with pytest.raises(ValueError):
        draw_committee(b"short", everyone, 2)


def test_the_mix_does_not_depend_on_the_order_of_reveals():
    reveals = [(b"\x01" * 32, A), (b"\x02" * 32, B), (b"\x03" * 32, C)]
    forward = bytes(32)
    for value, who in reveals:
        forward = mix_in(forward, value, who)
    backward = bytes(32)
    for value, who in reversed(reveals):
        backward = mix_in(backward, value, who)
    assert forward == backward != bytes(32)


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="top_k"):
        decide_round([A], {}, top_k=0)
    with pytest.raises(ValueError, match="outside"):
        decide_round([A], {D: {A: 10_001}}, top_k=1)


F = f"0x{0xF:040x}"


def test_an_update_must_beat_the_base_model_by_the_margin():
    """A constant model scores about what the base model scores (1/classes on balanced data): it fails."""
    scores = {
        D: {A: 9000, B: 1000, C: 1250},
        E: {A: 8800, B: 1000, C: 1300},
        F: {A: 9100, B: 1000, C: 1200},
    }
    base = {D: 1000, E: 1000, F: 1100}
    out = decide_round([A, B, C], scores, top_k=3, base_scores=base, margin=0)
    assert out.base_median == 1000
    assert out.accepted == [A, C]  # B (the base model's score) does not beat it
    out = decide_round([A, B, C], scores, top_k=3, base_scores=base, margin=250)
    assert out.accepted == [A]  # C beats the base by 250 only, not by more
    # The ranking does not depend on the margin.
    assert out.ranking == [A, C, B]  # every trainer ranked, those below the bar too


def test_one_hostile_base_score_cannot_lower_the_bar_of_a_committee_of_three():
    scores = {D: {A: 5000}, E: {A: 5000}, F: {A: 10_000}}
    out = decide_round([A], scores, top_k=1, base_scores={D: 8000, E: 8000, F: 0}, margin=0)
    assert out.base_median == 8000 and out.accepted == []


def test_without_base_scores_the_rule_is_median_above_the_margin():
    out = decide_round([A, B], {D: {A: 300, B: 200}}, top_k=2, margin=250)
    assert out.base_median == 0 and out.accepted == [A]


def test_margin_and_base_scores_are_bounded():
    with pytest.raises(ValueError, match="margin"):
        decide_round([A], {D: {A: 1}}, top_k=1, margin=-1)
    with pytest.raises(ValueError, match="base score"):
        decide_round([A], {D: {A: 1}}, top_k=1, base_scores={D: 10_001})
