"""fl_node.score: good updates outscore garbage; malformed or non-finite updates score 0 without raising."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_node.codec import SparseRows, encode_update
from fl_node.committee import MAX_SCORE, score_to_int
from fl_node.score import (
    BASE_SCORE,
    relative_score_int,
    relative_update_score,
    score_update,
    score_update_int,
)
from fl_node.secure_random import SecureRandom


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(tokens))


@pytest.fixture
def setup():
    """A random global model, validation data from a known teacher, and the update that reaches the teacher."""
    torch.manual_seed(0)
    teacher = TinyClassifier()
    with torch.no_grad():
        teacher.head.weight.mul_(10)
    model = TinyClassifier()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    x_val = torch.randint(0, 10, (200,))
    with torch.no_grad():
        y_val = teacher(x_val).argmax(dim=1)
    good = {name: teacher.state_dict()[name] - global_state[name] for name in global_state}
    return model, global_state, good, x_val, y_val


def test_good_update_scores_higher_than_garbage(setup):
    model, global_state, good, x_val, y_val = setup
    generator = torch.Generator().manual_seed(1)
    garbage = {name: torch.randn(t.shape, generator=generator) * 50 for name, t in global_state.items()}
    good_score = score_update(model, global_state, good, x_val, y_val, batch_size=64)
    garbage_score = score_update(model, global_state, garbage, x_val, y_val, batch_size=64)
    assert good_score == 1.0
    assert 0.0 <= garbage_score < good_score


def test_bytes_and_tensors_score_the_same(setup):
    model, global_state, good, x_val, y_val = setup
    from_tensors = score_update(model, global_state, good, x_val, y_val)
    assert score_update(model, global_state, encode_update(good), x_val, y_val) == from_tensors


def test_sparse_rows_are_accepted(setup):
    model, global_state, good, x_val, y_val = setup
    zero_update = {name: torch.zeros_like(t) for name, t in global_state.items()}
    zero_update["embedding.weight"] = SparseRows(
        torch.tensor([], dtype=torch.int64), torch.zeros(0, 4), (10, 4)
    )
    baseline = score_update(model, global_state, zero_update, x_val, y_val)
    model.load_state_dict(global_state)
    with torch.no_grad():
        expected = float((model(x_val).argmax(dim=1) == y_val).float().mean())
    assert baseline == pytest.approx(expected)


def test_likelihood_metric_is_in_unit_interval_and_ranks(setup):
    model, global_state, good, x_val, y_val = setup
    noisy = {name: t + torch.randn_like(t) * 5 for name, t in good.items()}
    good_score = score_update(model, global_state, good, x_val, y_val, metric="likelihood")
    noisy_score = score_update(model, global_state, noisy, x_val, y_val, metric="likelihood")
    assert 0.0 < noisy_score < good_score <= 1.0


def test_integer_score_matches_committee_rule(setup):
    model, global_state, good, x_val, y_val = setup
    value = score_update(model, global_state, good, x_val, y_val)
    assert score_update_int(model, global_state, good, x_val, y_val) == score_to_int(value) == MAX_SCORE


def malformed_updates(global_state: dict) -> dict[str, object]:
    zeros = {name: torch.zeros_like(t) for name, t in global_state.items()}
    nan = dict(zeros, **{"head.bias": torch.tensor([0.0, float("nan"), 0.0])})
    inf = dict(zeros, **{"head.weight": torch.full((3, 4), float("inf"))})
    # Finite in itself, but the model's outputs overflow to Inf.
    huge = dict(zeros, **{"head.weight": torch.full((3, 4), 3.4e38)})
    return {
        "nan": nan,
        "inf": inf,
        "non-finite outputs": huge,
        "missing tensor": {k: v for k, v in zeros.items() if k != "head.bias"},
        "unknown tensor": dict(zeros, extra=torch.zeros(1)),
        "wrong shape": dict(zeros, **{"head.bias": torch.zeros(4)}),
        "wrong dtype": dict(zeros, **{"head.bias": torch.zeros(3, dtype=torch.float64)}),
        "bad sparse indices": dict(
            zeros, **{"embedding.weight": SparseRows(torch.tensor([50]), torch.zeros(1, 4), (10, 4))}
        ),
        "garbage bytes": b"\x00\x01garbage" * 10,
        "truncated bytes": encode_update(zeros)[:-7],
        "nan in bytes": None,  # filled below: NaN smuggled past the encoder
        "not an update": 42,
    }


def test_malformed_updates_score_zero(setup):
    model, global_state, _, x_val, y_val = setup
    cases = malformed_updates(global_state)
    data = bytearray(encode_update({name: torch.zeros_like(t) for name, t in global_state.items()}))
    data[-4:] = torch.tensor([float("nan")]).numpy().tobytes()
    cases["nan in bytes"] = bytes(data)
    for label, update in cases.items():
        assert score_update(model, global_state, update, x_val, y_val) == 0.0, label
        assert score_update_int(model, global_state, update, x_val, y_val) == 0, label


def test_caller_errors_still_raise(setup):
    model, global_state, good, x_val, y_val = setup
    with pytest.raises(ValueError, match="metric"):
        score_update(model, global_state, good, x_val, y_val, metric="f1")
    with pytest.raises(ValueError, match="validation set"):
        score_update(model, global_state, good, x_val[:0], y_val[:0])


def test_text_model_update_with_sparse_embedding_rows():
    models = pytest.importorskip("fl_node.models")
    model = models.create_model("text", input_shape=(6,), num_classes=3, vocab_size=200, embed_dim=8, seed=0)
    teacher = models.create_model(
        "text", input_shape=(6,), num_classes=3, vocab_size=200, embed_dim=8, seed=1
    )
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    x_val = torch.randint(1, 20, (100, 6))  # only tokens 1..19 appear: 10% of the embedding rows
    with torch.no_grad():
        y_val = teacher(x_val).argmax(dim=1)
    good = {name: teacher.state_dict()[name] - global_state[name] for name in global_state}
    good["embedding.weight"][20:] = 0.0  # rows of unseen tokens do not change
    data = encode_update(good)
    assert len(data) < 0.2 * 200 * 8 * 4 + 2000  # the embedding travels as sparse rows
    assert score_update(model, global_state, data, x_val, y_val) == 1.0
    assert score_update(model, global_state, good, x_val, y_val) == 1.0


def test_noisy_scores_are_private_releases_around_the_exact_score(setup):
    """With a noise multiplier a score is a noisy count: it varies, centred on the exact one."""
    model, global_state, good, x_val, y_val = setup
    exact = score_update(model, global_state, good, x_val, y_val)
    noisy = [
        score_update(model, global_state, good, x_val, y_val, noise_multiplier=8.0, records=len(x_val))
        for _ in range(200)
    ]
    below = [v for v in noisy if v < 1.0]  # a count noised past 200 of 200 is clamped to 1.0
    assert len(set(below)) > 20
    assert min(noisy) < exact - 0.02
    # The count's noise has std 8 records out of 200: 0.04 on the score.
    assert all(abs(v - exact) < 6 * 0.04 for v in noisy)


def test_a_noisy_score_is_normalized_by_the_public_count_not_the_split(setup):
    """A noisy score is the accounted noisy count post-processed by public values only: divided by
    the plan's public count, never by the validation set's own size (its distribution is
    record-independent only through the keyed split's coupling; the public count needs none)."""
    model, global_state, good, x_val, y_val = setup
    with pytest.raises(ValueError, match="public record count"):
        score_update(model, global_state, good, x_val, y_val, noise_multiplier=1.0)
    secret = b"scorer noise, fixed for the test"
    planned = len(x_val) + 7  # the plan's count, not the set's size

    def noisy(x, y):
        return score_update(
            model,
            global_state,
            good,
            x,
            y,
            noise_multiplier=1.0,
            records=planned,
            randomness=SecureRandom.derive(secret, "score"),
        )

    whole, without_one = noisy(x_val, y_val), noisy(x_val[1:], y_val[1:])
    # Same noise draw: the releases differ by the one (correctly classified) record over the public
    # count, not by a change of normalizer, which would move every record's share.
    assert (whole - without_one) * planned == pytest.approx(1.0)
    # The exact score of a non-private job keeps the set's own size.
    assert score_update(model, global_state, good, x_val, y_val) == 1.0


def test_noise_never_makes_a_well_formed_update_look_malformed(setup):
    """0 on chain means malformed: a noisy score of a well-formed update is at least 1 bp."""
    model, global_state, good, x_val, y_val = setup
    bad = {name: -30 * value for name, value in good.items()}
    scores = [
        score_update_int(model, global_state, bad, x_val, y_val, noise_multiplier=200.0, records=len(x_val))
        for _ in range(50)
    ]
    assert min(scores) >= 1
    assert (
        score_update_int(
            model, global_state, b"garbage", x_val, y_val, noise_multiplier=200.0, records=len(x_val)
        )
        == 0
    )


def test_under_noise_a_record_with_a_non_finite_output_does_not_decide_the_score(setup):
    """Attack class: a crafted update whose outputs are non-finite only on some inputs.

    Without noise such a model scores 0 (an exact, public test of whether such an input is in
    the validation set); under noise the record just counts as wrong.
    """
    model, global_state, good, x_val, y_val = setup
    poisoned = dict(good)
    weight = global_state["embedding.weight"] + good["embedding.weight"]
    poisoned["embedding.weight"] = good["embedding.weight"].clone()
    # Token 3's row becomes huge but finite: the model is well-formed, its logits overflow on 3.
    poisoned["embedding.weight"][3] = 3e38 - weight[3]
    assert score_update(model, global_state, poisoned, x_val, y_val) == 0.0
    noisy = score_update(
        model, global_state, poisoned, x_val, y_val, noise_multiplier=1.0, records=len(x_val)
    )
    assert noisy > 0.5


def test_relative_scores_put_the_base_at_the_middle_and_an_update_at_its_gain(setup):
    model, global_state, good, x_val, y_val = setup
    zeros = {name: torch.zeros_like(t) for name, t in global_state.items()}
    base = score_update(model, global_state, zeros, x_val, y_val, metric="likelihood")
    better = score_update(model, global_state, good, x_val, y_val, metric="likelihood")
    assert relative_score_int(base, base) == BASE_SCORE  # a free rider gains exactly nothing
    assert relative_score_int(better, base) == min(MAX_SCORE, BASE_SCORE + round((better - base) * MAX_SCORE))
    assert relative_score_int(better, base) > BASE_SCORE > relative_score_int(base / 2, base) > 0
    assert (
        relative_score_int(1.0, 0.0) == MAX_SCORE and relative_score_int(1e-4, 1.0) == 1
    )  # clamped, never 0


def test_relative_score_of_a_malformed_update_is_zero_and_a_bad_base_raises(setup):
    model, global_state, _, x_val, y_val = setup
    for label, update in malformed_updates(global_state).items():
        if update is None:
            continue
        value = score_update(model, global_state, update, x_val, y_val, metric="likelihood")
        assert relative_score_int(value, 0.5) == 0, label
    assert relative_score_int(float("nan"), 0.5) == 0
    with pytest.raises(ValueError):
        relative_score_int(0.5, float("nan"))


def test_relative_update_score_evaluates_the_update_at_its_share_and_rejects_malformed_ones(setup):
    model, global_state, good, x_val, y_val = setup
    zeros = {name: torch.zeros_like(t) for name, t in global_state.items()}
    base = score_update(model, global_state, zeros, x_val, y_val, metric="likelihood")
    quarter = {name: value / 4 for name, value in good.items()}
    expected = relative_score_int(
        score_update(model, global_state, quarter, x_val, y_val, metric="likelihood"), base
    )
    got = relative_update_score(
        model, global_state, encode_update(good), x_val, y_val, base_value=base, scale=0.25
    )
    assert got == expected
    full = relative_update_score(model, global_state, good, x_val, y_val, base_value=base)
    assert full == relative_score_int(
        score_update(model, global_state, good, x_val, y_val, metric="likelihood"), base
    )
    assert full > BASE_SCORE  # the teacher's model is better than the random one
    assert (
        relative_update_score(model, global_state, zeros, x_val, y_val, base_value=base, scale=0.25)
        == BASE_SCORE
    )
    for label, update in malformed_updates(global_state).items():
        if update is not None:
            assert relative_update_score(model, global_state, update, x_val, y_val, base_value=base) == 0, (
                label
            )
    with pytest.raises(ValueError):
        relative_update_score(model, global_state, good, x_val, y_val, base_value=base, scale=0.0)


def test_relative_update_score_scores_a_boosted_update_as_the_clipped_step_it_can_make(setup):
    model, global_state, good, x_val, y_val = setup
    zeros = {name: torch.zeros_like(t) for name, t in global_state.items()}
    base = score_update(model, global_state, zeros, x_val, y_val, metric="likelihood")
    norm = float(sum((value.double() ** 2).sum() for value in good.values()) ** 0.5)
    half = {name: value / 2 for name, value in good.items()}
    boosted = {name: value * 5 for name, value in half.items()}  # 2.5x the good update's length

    def score(update, clip):
        return relative_update_score(
            model, global_state, update, x_val, y_val, base_value=base, scale=0.25, clip_norm=clip
        )

    # Clipped to the good update's norm, the boosted one is exactly the good update (same direction).
    assert score(boosted, norm) == score(good, None)
    assert score(boosted, None) != score(good, None)  # unclipped it is judged at its boosted length
    assert score(half, norm) == score(half, None)  # a shorter update is not lengthened
    assert score(zeros, norm) == BASE_SCORE
    poisoned = dict(good) | {"head.bias": torch.tensor([float("nan"), 0.0, 0.0])}
    assert score(poisoned, norm) == 0
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            score(good, bad)
