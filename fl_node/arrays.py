"""Datasets held as numpy arrays (``ArrayDataset``, a dataset's ``DatasetSplits``) and the array
helpers the dataset loaders and generators share (a stratified split, Zipf probabilities).

The bottom of the data modules: fl_node.text (the generated text and click data) imports only
this, and fl_node.data (the registered datasets, keyed splits) imports both, so no two of them
import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def zipf_probabilities(vocab_size: int, exponent: float) -> np.ndarray:
    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    weights = ranks**-exponent
    return weights / weights.sum()
