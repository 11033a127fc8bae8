"""Partitions are seeded, disjoint, covering, non-empty; Dirichlet skews with small alpha."""

import numpy as np
import pytest

from fl_node.partition import label_histogram, parse_spec, partition

LABELS = np.repeat(np.arange(10), 100)


@pytest.mark.parametrize("spec", ["iid", "dirichlet:0.5", "dirichlet:0.1", "shards:2"])
def test_disjoint_covering_nonempty_reproducible(spec):
    parts = partition(LABELS, 5, spec, seed=7)
    assert len(parts) == 5 and all(len(p) > 0 for p in parts)
    joined = np.concatenate(parts)
    assert len(joined) == len(LABELS) and set(joined.tolist()) == set(range(len(LABELS)))
    again = partition(LABELS, 5, spec, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition(LABELS, 5, spec, seed=8)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def _mean_dominant_share(spec):
    hist = label_histogram(LABELS, partition(LABELS, 5, spec, seed=0), 10)
    return float(np.mean(hist.max(axis=1) / hist.sum(axis=1)))


def test_dirichlet_is_skewed_at_small_alpha():
    iid, mild, skewed = (_mean_dominant_share(s) for s in ["iid", "dirichlet:100", "dirichlet:0.1"])
    assert iid < 0.2 and mild < 0.2
    assert skewed > 0.35


def test_shards_give_few_labels_per_part():
    hist = label_histogram(LABELS, partition(LABELS, 5, "shards:2", seed=0), 10)
    assert np.all((hist > 0).sum(axis=1) <= 3)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "dirichlet",
        "dirichlet:-1",
        "dirichlet:abc",
        "dirichlet:nan",
        "shards:0",
        "shards:x",
        "iid:3",
        "random",
    ],
)
def test_bad_spec_is_a_clear_error(spec):
    with pytest.raises(ValueError, match="bad partition spec"):
        parse_spec(spec)


def test_bad_part_counts():
    with pytest.raises(ValueError, match="num_parts"):
        partition(LABELS, 0, "iid", seed=0)
    with pytest.raises(ValueError, match="num_parts"):
        partition(LABELS[:3], 4, "iid", seed=0)
    with pytest.raises(ValueError, match="shards"):
        partition(LABELS[:10], 5, "shards:3", seed=0)
