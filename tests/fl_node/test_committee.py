"""The reference committee rule on hand-made rounds."""

import pytest

from fl_node.committee import decide_round, median_score, score_to_int

A, B, C, D, E = (f"0x{i:040x}" for i in (0xA, 0xB, 0xC, 0xD, 0xE))


def test_median_odd_even_and_empty():
    assert median_score([3, 1, 2]) == 2
    assert median_score([1, 4]) == 2  # floor of 2.5
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
    out = decide_round([A, B, C], scores, top_k=3, committee_size=2, current_committee=[D, E])
    assert out.medians == {A: 8500, B: 4800, C: 0}
    assert out.accepted == [A, B]
    assert out.next_committee == [A, B]


def test_ties_are_broken_by_smaller_address():
    scores = {D: {C: 7000, A: 7000, B: 7000}}
    out = decide_round([C, B, A], scores, top_k=2, committee_size=1, current_committee=[D])
    assert out.accepted == [A, B]
    assert out.next_committee == [A]


def test_missing_committee_member_is_ignored_and_seats_filled_from_current_committee():
    scores = {D: {A: 5000}}
    out = decide_round([A], scores, top_k=1, committee_size=2, current_committee=[D, E])
    assert out.accepted == [A]
    assert out.next_committee == [A, D]


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="top_k"):
        decide_round([A], {}, top_k=0, committee_size=1)
    with pytest.raises(ValueError, match="outside"):
        decide_round([A], {D: {A: 10_001}}, top_k=1, committee_size=1)
