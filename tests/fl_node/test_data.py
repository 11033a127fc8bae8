"""Datasets load offline, split reproducibly and keep their documented shapes."""

import numpy as np
import pytest
import torch

from fl_node.data import load_dataset


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist", seed=0)


def test_mnist_split_sizes_and_ranges(mnist):
    assert (len(mnist.train), len(mnist.val), len(mnist.test)) == (3600, 400, 1000)
    assert mnist.input_shape == (1, 28, 28) and mnist.num_classes == 10
    assert mnist.train.x.dtype == np.float32 and mnist.train.y.dtype == np.int64
    assert 0.0 <= mnist.train.x.min() and mnist.train.x.max() <= 1.0
    # stratified: every class has exactly 100 test images
    assert np.all(np.bincount(mnist.test.y) == 100)


def test_splits_are_disjoint_and_reproducible(mnist):
    again = load_dataset("mnist", seed=0)
    other = load_dataset("mnist", seed=1)
    np.testing.assert_array_equal(mnist.train.x, again.train.x)
    assert not np.array_equal(mnist.test.y, other.test.y) or not np.array_equal(mnist.test.x, other.test.x)
    rows = {r.tobytes() for r in mnist.test.x.reshape(len(mnist.test), -1)}
    assert not any(r.tobytes() in rows for r in mnist.train.x.reshape(len(mnist.train), -1)[:500])


def test_digits():
    digits = load_dataset("digits", seed=3)
    assert digits.input_shape == (1, 8, 8)
    assert len(digits.train) + len(digits.val) + len(digits.test) == 1797
    x, y = digits.train.to_torch()[:4]
    assert x.dtype == torch.float32 and y.dtype == torch.int64


def test_zipf_text_is_zipfian_and_learnable_in_principle():
    text = load_dataset("zipf_text", seed=0, num_samples=2000, vocab_size=20_000)
    x, y = text.train.x, text.train.y
    assert x.dtype == np.int64 and x.min() >= 1 and x.max() < 20_000
    assert text.vocab_size == 20_000 and text.input_shape == (32,)
    counts = np.bincount(x.ravel(), minlength=20_000)
    # Zipf: the most frequent token is far more common than the hundredth.
    ranked = np.sort(counts)[::-1]
    assert ranked[0] > 20 * ranked[99]
    # class-indicative tokens: some token occurs almost only in one class
    per_class = np.stack([np.bincount(x[y == c].ravel(), minlength=20_000) for c in range(text.num_classes)])
    purity = per_class.max(axis=0) / np.maximum(per_class.sum(axis=0), 1)
    assert np.sum((purity > 0.9) & (per_class.sum(axis=0) > 20)) >= 20


def test_zipf_text_plants_its_class_tokens_within_the_given_ranks():
    text = load_dataset("zipf_text", seed=0, num_samples=2000, vocab_size=20_000, indicative_ranks=(200, 499))
    x, y = text.train.x, text.train.y
    per_class = np.stack([np.bincount(x[y == c].ravel(), minlength=20_000) for c in range(text.num_classes)])
    purity = per_class.max(axis=0) / np.maximum(per_class.sum(axis=0), 1)
    pure = np.flatnonzero((purity > 0.9) & (per_class.sum(axis=0) > 20))
    assert len(pure) >= 15 and pure.min() >= 201 and pure.max() <= 499  # token id = rank + 1
    default = load_dataset("zipf_text", seed=0, num_samples=200, vocab_size=20_000)
    assert np.array_equal(default.train.x, load_dataset("zipf_text", seed=0, num_samples=200).train.x)
    for bad in [(0, 50), (200, 250), (19_990, 20_001), (300, 200)]:  # rank 0 / too few / past the end / empty
        with pytest.raises(ValueError, match="indicative_ranks"):
            load_dataset("zipf_text", seed=0, num_samples=50, vocab_size=20_000, indicative_ranks=bad)


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dataset 'cifar'.*mnist"):
        load_dataset("cifar")


def test_map_features_transforms_every_split():
    from fl_node.data import map_features

    digits = load_dataset("digits", seed=0)
    doubled = map_features(digits, lambda x: torch.cat([x, 2 * x], dim=1).flatten(1), batch_size=100)
    assert doubled.input_shape == (128,) and doubled.num_classes == digits.num_classes
    for before, after in [
        (digits.train, doubled.train),
        (digits.val, doubled.val),
        (digits.test, doubled.test),
    ]:
        np.testing.assert_array_equal(after.y, before.y)
        np.testing.assert_allclose(after.x[:, 64:], 2 * before.x.reshape(len(before), -1))


# ---------------------------------------------------------------- a provider's keyed split

KEY = bytes(range(32))


def _records(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((count, 6)).astype(np.float32), rng.integers(0, 4, count)


def test_adding_one_record_moves_no_other_record_across_any_split():
    """D and D plus x: every part (train, validation, the public hold-out) differs in x alone."""
    from fl_node.data import keyed_holdout, keyed_split, record_digests

    x, y = _records(1001)
    with_x = record_digests(x, y)
    without = with_x[:-1]
    for label, fractions in [
        ("job-seed:7", (0.9, 0.1)),
        ("public-holdout", (0.8, 0.2)),
        ("three", (0.6, 0.3, 0.1)),
    ]:
        before = keyed_split(KEY, without, fractions, label=label)
        after = keyed_split(KEY, with_x, fractions, label=label)
        changed = [set(a.tolist()) ^ set(b.tolist()) for a, b in zip(before, after, strict=True)]
        assert sorted(set().union(*changed)) == [1000]  # only x, on exactly one side
        assert sum(len(c) for c in changed) == 1
    kept, held = keyed_holdout(KEY, with_x, 0.1, label="job-seed:7")
    assert len(kept) + len(held) == 1001 and 50 < len(held) < 160


def test_the_old_seeded_stratified_split_moved_hundreds_of_records():
    """What the keyed split replaces: a permutation seeded by the whole dataset moves ~a third."""
    from fl_node.data import stratified_split

    _, y = _records(1001)
    before = stratified_split(y[:-1], (0.9, 0.1), seed=1)[1]
    after = stratified_split(y, (0.9, 0.1), seed=2)[1]  # the seed was the content hash: it changes
    assert len(set(before.tolist()) ^ set(after.tolist())) > 100


def test_keyed_positions_are_record_functions_independent_of_order_and_key_dependent():
    from fl_node.data import keyed_split, record_digests, record_positions

    x, y = _records(400, seed=1)
    digests = record_digests(x, y)
    order = np.random.default_rng(0).permutation(400)
    shuffled = [digests[i] for i in order]
    np.testing.assert_array_equal(
        record_positions(KEY, digests, "a")[order], record_positions(KEY, shuffled, "a")
    )
    # Another key or another use: unrelated positions.
    assert not np.array_equal(record_positions(KEY, digests, "a"), record_positions(KEY, digests, "b"))
    assert not np.array_equal(record_positions(KEY, digests, "a"), record_positions(b"k" * 32, digests, "a"))
    # Copies of one record are separate records (the k-th copy's side depends on the record and k).
    twice = record_digests(np.repeat(x[:1], 200, axis=0), np.repeat(y[:1], 200))
    kept, held = keyed_split(KEY, twice, (0.5, 0.5), label="a")
    assert 50 < len(held) < 150
    with pytest.raises(ValueError, match="16 bytes"):
        record_positions(b"short", digests, "a")
    with pytest.raises(ValueError, match="sum to 1"):
        keyed_split(KEY, digests, (0.5, 0.4), label="a")


def test_a_tiny_dataset_keeps_a_record_on_each_side():
    from fl_node.data import keyed_holdout, record_digests

    x, y = _records(3, seed=2)
    digests = record_digests(x, y)
    for label in (f"job-seed:{i}" for i in range(40)):
        kept, held = keyed_holdout(KEY, digests, 0.1, label=label)
        assert len(kept) and len(held) and sorted([*kept, *held]) == [0, 1, 2]
    with pytest.raises(ValueError, match="two records"):
        keyed_holdout(KEY, digests[:1], 0.1, label="a")
