"""Split one dataset's indices among federated clients, IID or label-skewed.

Specs (strings, so they fit in a CLI flag or a job config):

* ``"iid"`` -- a seeded shuffle cut into near-equal parts.
* ``"dirichlet:ALPHA"`` -- for each class, the share of every client is drawn
  from Dirichlet(ALPHA); small ALPHA gives clients few dominant labels (Hsu,
  Qi and Brown 2019, "Measuring the Effects of Non-Identical Data Distribution
  for Federated Visual Classification"; Yurochkin et al. 2019).
* ``"shards:K"`` -- sort by label, cut into ``num_parts * K`` shards and give
  every client K of them (McMahan et al. 2017, "Communication-Efficient
  Learning of Deep Networks from Decentralized Data").

Every part is non-empty, parts are disjoint and together cover every index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Redraws before Dirichlet gives up on leaving no client empty; at alpha >= 0.01
# with more samples than clients a handful of draws is plenty.
_DIRICHLET_ATTEMPTS = 100


@dataclass(frozen=True)
class PartitionSpec:
    kind: str
    alpha: float | None = None
    shards_per_part: int | None = None


def parse_spec(spec: str) -> PartitionSpec:
    """Parse ``"iid"``, ``"dirichlet:ALPHA"`` or ``"shards:K"``; ValueError otherwise."""
    kind, _, arg = spec.strip().partition(":")
    if kind == "iid" and not arg:
        return PartitionSpec("iid")
    if kind == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            alpha = float("nan")
        if not np.isfinite(alpha) or alpha <= 0:
            raise ValueError(
                f"bad partition spec {spec!r}: dirichlet needs a positive alpha, e.g. 'dirichlet:0.5'"
            )
        return PartitionSpec("dirichlet", alpha=alpha)
    if kind == "shards":
        if not arg.isdigit() or int(arg) < 1:
            raise ValueError(f"bad partition spec {spec!r}: shards needs a positive integer, e.g. 'shards:2'")
        return PartitionSpec("shards", shards_per_part=int(arg))
    raise ValueError(f"bad partition spec {spec!r}: expected 'iid', 'dirichlet:ALPHA' or 'shards:K'")


def partition(labels: np.ndarray, num_parts: int, spec: str, *, seed: int) -> list[np.ndarray]:
    """Return ``num_parts`` sorted, disjoint, non-empty index arrays covering ``labels``."""
    parsed = parse_spec(spec)
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    if not 1 <= num_parts <= len(labels):
        raise ValueError(
            f"num_parts must be between 1 and the number of samples ({len(labels)}), got {num_parts}"
        )
    rng = np.random.default_rng(seed)
    if parsed.kind == "iid":
        parts = iid_parts(len(labels), num_parts, rng)
    elif parsed.kind == "dirichlet" and parsed.alpha is not None:
        parts = dirichlet_parts(labels, num_parts, parsed.alpha, rng)
    elif parsed.kind == "shards" and parsed.shards_per_part is not None:
        parts = shard_parts(labels, num_parts, parsed.shards_per_part, rng)
    else:  # parse_spec gives each kind its argument
        raise ValueError(f"bad partition spec {spec!r}")
    return [np.sort(p) for p in parts]


def iid_parts(num_samples: int, num_parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(num_samples), num_parts)


def dirichlet_parts(
    labels: np.ndarray, num_parts: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Label-skewed split; redraws (from the same seeded stream) while some part is empty."""
    classes = np.unique(labels)
    for _ in range(_DIRICHLET_ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_parts)]
        for label in classes:
            idx = rng.permutation(np.flatnonzero(labels == label))
            shares = rng.dirichlet(np.full(num_parts, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for part, chunk in zip(parts, np.split(idx, cuts), strict=True):
                part.append(chunk)
        joined = [np.concatenate(p) for p in parts]
        if min(len(p) for p in joined) > 0:
            return joined
    raise ValueError(
        f"dirichlet:{alpha} left a part empty in {_DIRICHLET_ATTEMPTS} draws; "
        f"use fewer parts than {num_parts} or a larger alpha"
    )


def shard_parts(
    labels: np.ndarray, num_parts: int, shards_per_part: int, rng: np.random.Generator
) -> list[np.ndarray]:
    num_shards = num_parts * shards_per_part
    if num_shards > len(labels):
        raise ValueError(
            f"shards:{shards_per_part} needs {num_shards} shards but there are only {len(labels)} samples"
        )
    # A stable sort after a shuffle keeps shards label-pure yet random within a label.
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_shards)
    order = rng.permutation(num_shards).reshape(num_parts, shards_per_part)
    return [np.concatenate([shards[s] for s in row]) for row in order]


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Counts per (part, class): a quick look at how skewed a partition is."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
