"""Aggregation: pure maths over lists of tensors, and strategies that only coordinate it.

Every node recomputes the new global model from the accepted updates and must get
the same bytes, so the maths here is written for bit-exact reproducibility:

* Updates are sorted by their id (content hash or trainer address) before any
  reduction, so arrival order does not matter.
* Reductions run in list order, one correctly rounded IEEE operation at a time
  (a multiply into scratch, then an add). We never use ``alpha=`` or other
  fused forms: whether a kernel contracts ``a + w * b`` into an FMA depends on
  the CPU's vector path, and an FMA rounds differently. Elementwise kernels
  compute each element independently, so intra-op threads cannot change bits;
  we avoid torch's reductions (``sum``, ``mean``), whose association order
  depends on vector width and threads.
* Order statistics use a sorting network of elementwise ``minimum``/``maximum``
  (exact), and outputs are normalised with ``+ 0.0`` so that the sign of a zero
  cannot depend on which of two equal values a kernel returned.
* Work proceeds in cache-sized chunks, which keeps the scratch buffers in L2 and
  lets FedAvg run at memory bandwidth.

Algorithms:

* FedAvg — McMahan et al. 2017, "Communication-Efficient Learning of Deep
  Networks from Decentralized Data": sample-weighted mean of the deltas.
* FedProx — Li et al. 2020, "Federated Optimization in Heterogeneous Networks":
  the proximal term ``mu/2 ||w - w_global||^2`` is part of *local* training
  (``proximal_mu`` tells trainers its weight); the server aggregates as FedAvg.
* FedAdam / FedYogi — Reddi et al. 2021, "Adaptive Federated Optimization",
  Algorithm 2: the mean delta is a pseudo-gradient for a server Adam/Yogi step
  (no bias correction, ``v`` starts at ``tau**2``). The moments are returned as
  server state, a flat ``{"m/<name>", "v/<name>"}`` dict that
  :func:`fl_node.codec.encode_model` stores with the global model.
* Coordinate-wise median and trimmed mean — Yin et al. 2018, "Byzantine-Robust
  Distributed Learning: Towards Optimal Statistical Rates". Unweighted, since a
  Byzantine trainer could claim any sample count.
* Krum / Multi-Krum — Blanchard et al. 2017, "Machine Learning with Adversaries:
  Byzantine Tolerant Gradient Descent". Unweighted for the same reason.
  Squared distances come from float64 Gram matrices of chunks; BLAS may sum in
  a different order on another CPU, changing the last bits of a distance, which
  could only change the choice between two updates at a near-exact tie (ties
  are broken by id). The averaging itself is exact as above.
* Bounded influence (:func:`bounded_weights`) — a sample count is what a trainer claims (at most
  its registered dataset size, which its registrant declares), so a weight from it alone lets one
  member make FedAvg return its own update. Each update's share is capped at the job's
  ``max_share_bp`` and the rest water-filled over the others in proportion to their samples, in
  integers: every node gets the same weights.
* Hybrid — dense tensors as FedAvg; row-sparse tensors (embeddings) average each
  row only over the updates that touched it, weighted by those updates'
  samples, as in sparse federated NLP (e.g. Niu et al. 2020, sub-model FL), or,
  with ``rows="all"``, over every update (FedAvg's model from the touched rows
  alone: sparse-aware hybrid averaging, Kim et al. 2019, "Parallax"). Updates
  arrive dense or as delta arrays (fl_node.sparse); the result is the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from fl_node.codec import SparseRows, Update, densify, to_sparse_rows, touched_rows, value_shape

# Chunk sizes in elements. 32768 float32 (128 KiB) keeps the running sum and the scratch in L2, and
# is at torch's intra-op grain size, so each op runs on the calling thread: on a shared 2-core box,
# OpenMP barriers across threads stall whenever another process holds a core (measured: 5x slower).
CHUNK = 1 << 15
SORT_CHUNK = 1 << 14  # the sorting network keeps n + 2 chunk buffers live

State = dict[str, Tensor]


# A share of an aggregate in basis points: 10000 is the whole (no cap).
MAX_SHARE_BP = 10_000


@dataclass(frozen=True)
class WeightedUpdate:
    """One accepted update: its tensors, the samples it was trained on, and a unique id used for ordering."""

    update: Update
    num_samples: int
    id: str


# ================================================================ pure maths


def _flat(tensor: Tensor) -> Tensor:
    return tensor.contiguous().view(-1)


def _canonical_zeros(tensor: Tensor) -> Tensor:
    return tensor.add_(0.0)  # -0.0 + 0.0 == +0.0; every other value is unchanged


def weighted_sum(
    tensors: Sequence[Tensor], weights: Sequence[float], *, offset: Tensor | None = None
) -> Tensor:
    """``sum_i weights[i] * tensors[i]`` in float32, reduced in list order, plus ``offset`` if given.

    Adding the offset (the global model) inside the chunk loop saves a pass over
    memory and gives the same bits as adding it afterwards (IEEE addition commutes).
    """
    if not tensors or len(tensors) != len(weights):
        raise ValueError("weighted_sum needs as many weights as tensors, and at least one")
    out = torch.empty(tensors[0].shape, dtype=torch.float32)
    flats = [_flat(t) for t in tensors]
    out_flat = out.view(-1)
    offset_flat = None if offset is None else _flat(offset)
    numel = out_flat.numel()
    scratch = torch.empty(min(CHUNK, numel), dtype=torch.float32)
    for start in range(0, numel, CHUNK):
        stop = min(numel, start + CHUNK)
        acc, tmp = out_flat[start:stop], scratch[: stop - start]
        torch.mul(flats[0][start:stop], weights[0], out=acc)
        for flat, weight in zip(flats[1:], weights[1:], strict=True):
            torch.mul(flat[start:stop], weight, out=tmp)
            acc.add_(tmp)
        if offset_flat is not None:
            acc.add_(offset_flat[start:stop])
    return out


def bounded_weights(samples: Sequence[int], max_share_bp: int) -> list[int]:
    """Integer weights whose shares are those of ``samples``, water-filled so that none is above
    ``max_share_bp`` basis points: the largest are capped at the cap one by one while any share is
    above it, and what is left is split over the rest in proportion to their samples. When the cap
    cannot be met (``n * max_share_bp <= 10000``: n shares of at most the cap sum to less than the
    whole) every update gets the same weight, ``1 / n``. Integer arithmetic only: every node gets
    the same weights, whatever the order of ``samples``."""
    if type(max_share_bp) is not int or not 1 <= max_share_bp <= MAX_SHARE_BP:
        raise ValueError(f"max_share_bp must be an integer in [1, {MAX_SHARE_BP}], got {max_share_bp!r}")
    if any(type(w) is not int or w <= 0 for w in samples):
        raise ValueError("sample counts must be positive integers")
    n = len(samples)
    if n * max_share_bp <= MAX_SHARE_BP:
        return [1] * n
    capped: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in capped]
        total = sum(samples[i] for i in free)
        left = MAX_SHARE_BP - len(capped) * max_share_bp  # basis points the free updates share
        largest = max(free, key=lambda i: samples[i])
        # Its share, samples * left / (total * 10000), above the cap's max_share_bp / 10000:
        if samples[largest] * left <= max_share_bp * total:
            break
        capped.add(largest)
    # Shares over the common denominator total * 10000: a free update samples * left, a capped one
    # max_share_bp * total.
    return [max_share_bp * total if i in capped else samples[i] * left for i in range(n)]


def weighted_mean(
    tensors: Sequence[Tensor], weights: Sequence[float], *, offset: Tensor | None = None
) -> Tensor:
    """Weighted mean (plus ``offset``); weights are normalised in float64 before the float32 reduction."""
    total = float(sum(weights))
    if not total > 0:
        raise ValueError("weights must sum to a positive number")
    return weighted_sum(tensors, [w / total for w in weights], offset=offset)


@functools.cache
def sorting_network(n: int) -> tuple[tuple[int, int], ...]:
    """Comparators (i < j) of Batcher's odd-even merge sort for ``n`` inputs.

    Built for the next power of two; comparators touching padded positions are
    dropped, which is valid because padding with +inf never moves.
    """
    size = 1
    while size < n:
        size *= 2
    pairs = []
    block = 1
    while block < size:
        step = block
        while step >= 1:
            for j in range(step % block, size - step, 2 * step):
                for i in range(min(step, size - j - step)):
                    if (i + j) // (2 * block) == (i + j + step) // (2 * block):
                        pairs.append((i + j, i + j + step))
            step //= 2
        block *= 2
    return tuple((a, b) for a, b in pairs if b < n)


def _reduce_sorted(tensors: Sequence[Tensor], reduce: Callable[[list[Tensor], Tensor], None]) -> Tensor:
    """Sort each coordinate across ``tensors`` chunk by chunk; ``reduce(sorted_rows, out_chunk)`` fills the output."""
    n = len(tensors)
    if n == 0:
        raise ValueError("need at least one tensor")
    out = torch.empty(tensors[0].shape, dtype=torch.float32)
    flats = [_flat(t) for t in tensors]
    out_flat = out.view(-1)
    numel = out_flat.numel()
    width = min(SORT_CHUNK, max(numel, 1))
    buffers = [torch.empty(width, dtype=torch.float32) for _ in range(n + 2)]
    network = sorting_network(n)
    for start in range(0, numel, SORT_CHUNK):
        stop = min(numel, start + SORT_CHUNK)
        rows = [buffers[i][: stop - start] for i in range(n)]
        spare = [buffers[n][: stop - start], buffers[n + 1][: stop - start]]
        for row, flat in zip(rows, flats, strict=True):
            row.copy_(flat[start:stop])
        for a, b in network:
            low, high = spare
            torch.minimum(rows[a], rows[b], out=low)
            torch.maximum(rows[a], rows[b], out=high)
            spare = [rows[a], rows[b]]
            rows[a], rows[b] = low, high
        reduce(rows, out_flat[start:stop])
    return _canonical_zeros(out)


def coordinate_median(tensors: Sequence[Tensor]) -> Tensor:
    """Coordinate-wise median; for an even count, the mean of the two middle values."""
    n = len(tensors)

    def middle(rows: list[Tensor], out: Tensor) -> None:
        if n % 2:
            out.copy_(rows[n // 2])
        else:
            # 0.5 * a + 0.5 * b cannot overflow, unlike (a + b) / 2.
            torch.mul(rows[n // 2 - 1], 0.5, out=out)
            out.add_(rows[n // 2].mul(0.5))

    return _reduce_sorted(tensors, middle)


def trimmed_mean(tensors: Sequence[Tensor], beta: float) -> Tensor:
    """Coordinate-wise mean after dropping the ``floor(beta * n)`` smallest and largest values."""
    n = len(tensors)
    trim = int(beta * n)
    kept = n - 2 * trim
    if not 0 <= beta < 0.5 or kept < 1:
        raise ValueError(f"trimmed mean with beta={beta} keeps no value out of {n}")
    # Multiply by the reciprocal explicitly: torch may or may not turn a scalar division into that.
    scale = 1.0 / kept

    def mean_of_middle(rows: list[Tensor], out: Tensor) -> None:
        out.copy_(rows[trim])
        for row in rows[trim + 1 : n - trim]:
            out.add_(row)
        out.mul_(scale)

    return _reduce_sorted(tensors, mean_of_middle)


def pairwise_squared_distances(updates: Sequence[Sequence[Tensor]]) -> Tensor:
    """float64 (n, n) squared Euclidean distances between updates given as equal-length tensor lists."""
    n = len(updates)
    distances = torch.zeros((n, n), dtype=torch.float64)
    if n == 0:
        return distances
    for part in range(len(updates[0])):
        flats = [_flat(update[part]) for update in updates]
        numel = flats[0].numel()
        block = torch.empty((n, min(SORT_CHUNK, max(numel, 1))), dtype=torch.float32)
        for start in range(0, numel, SORT_CHUNK):
            stop = min(numel, start + SORT_CHUNK)
            rows = block[:, : stop - start]
            for i, flat in enumerate(flats):
                rows[i].copy_(flat[start:stop])
            # ||a||^2 + ||b||^2 - 2ab from a float64 Gram matrix: faster than pairwise differences,
            # and float64 keeps the cancellation error far below any distance that matters.
            rows64 = rows.double()
            gram = rows64 @ rows64.T
            norms = gram.diagonal()
            distances.add_(norms[:, None] + norms[None, :] - 2.0 * gram)
    return distances.clamp_(min=0.0).fill_diagonal_(0.0)


def krum_scores(distances: Tensor, f: int) -> list[float]:
    """Krum score of each update: the sum of squared distances to its ``n - f - 2`` nearest others."""
    n = distances.shape[0]
    if f < 0 or n < 2 * f + 3:
        raise ValueError(f"Krum needs n >= 2f + 3 updates; got n={n}, f={f}")
    neighbours = n - f - 2
    scores = []
    for i in range(n):
        others = sorted(float(distances[i, j]) for j in range(n) if j != i)
        scores.append(float(sum(others[:neighbours])))
    return scores


def krum_select(distances: Tensor, f: int, m: int) -> list[int]:
    """Indices of the ``m`` best-scoring updates, in input order; ties go to the earlier index."""
    scores = krum_scores(distances, f)
    if not 1 <= m <= len(scores):
        raise ValueError(f"Multi-Krum must select between 1 and {len(scores)} updates, not {m}")
    best = sorted(range(len(scores)), key=lambda i: (scores[i], i))[:m]
    return sorted(best)


ROW_RULES = ("touched", "all")


def row_sparse_mean(
    values: Sequence[SparseRows], weights: Sequence[float], shape: Sequence[int], *, over: str = "touched"
) -> Tensor:
    """Each row's weighted mean over the values that touched it; rows nobody touched are 0.

    ``over="all"`` divides every row by the weight of all values instead: FedAvg's
    mean, in which an untouched row counts as a zero delta, computed from the
    touched rows only.
    """
    if over not in ROW_RULES:
        raise ValueError(f"row rule must be one of {ROW_RULES}, not {over!r}")
    if over == "all":
        scale = float(sum(weights))
        if not scale > 0:
            raise ValueError("weights must sum to a positive number")
        out = torch.zeros(tuple(shape), dtype=torch.float32)
        for value, weight in zip(values, weights, strict=True):
            if value.indices.numel():
                out.index_add_(0, value.indices, value.values * (weight / scale))
        return _canonical_zeros(out)
    total = torch.zeros(tuple(shape), dtype=torch.float32)
    row_weight = torch.zeros(shape[0], dtype=torch.float64)  # exact for integer sample counts
    for value, weight in zip(values, weights, strict=True):
        if value.indices.numel() == 0:
            continue
        # Indices are unique within one update, so index_add_ adds each row exactly once: deterministic.
        total.index_add_(0, value.indices, value.values * weight)
        row_weight.index_add_(
            0, value.indices, torch.full((value.indices.numel(),), float(weight), dtype=torch.float64)
        )
    divisor = row_weight.clamp(min=1.0).to(torch.float32).view(-1, *([1] * (len(shape) - 1)))
    return _canonical_zeros(total.div_(divisor))


def adaptive_moments(
    m: Tensor, v: Tensor, delta: Tensor, *, beta1: float, beta2: float, yogi: bool
) -> tuple[Tensor, Tensor]:
    """Reddi et al. 2021 moment updates; Adam: ``v = b2 v + (1-b2) d^2``, Yogi: ``v -= (1-b2) d^2 sign(v - d^2)``."""
    new_m = torch.mul(m, beta1)
    new_m.add_(torch.mul(delta, 1.0 - beta1))
    squared = torch.mul(delta, delta)
    if yogi:
        direction = torch.sign(torch.sub(v, squared))
        new_v = v.clone()
        new_v.sub_(squared.mul_(1.0 - beta2).mul_(direction))
    else:
        new_v = torch.mul(v, beta2)
        new_v.add_(squared.mul_(1.0 - beta2))
    return new_m, new_v


def adaptive_step(x: Tensor, m: Tensor, v: Tensor, *, lr: float, tau: float) -> Tensor:
    """``x + lr * m / (sqrt(v) + tau)``, one rounded operation at a time."""
    denominator = torch.sqrt(v).add_(tau)
    step = torch.mul(m, lr).div_(denominator)
    return torch.add(x, step)


# ================================================================ coordination


def _prepare(global_state: Mapping[str, Tensor], updates: Sequence[WeightedUpdate]) -> list[WeightedUpdate]:
    """Validate the updates against the global model and sort them by id."""
    if not updates:
        raise ValueError("no updates to aggregate")
    ids = [u.id for u in updates]
    if not all(isinstance(i, str) and i for i in ids):
        raise ValueError("every update needs a non-empty string id")
    if len(set(ids)) != len(ids):
        raise ValueError("two updates share an id")
    ordered = sorted(updates, key=lambda u: u.id)
    names = set(ordered[0].update)
    if not names:
        raise ValueError(f"update {ordered[0].id} is empty")
    for item in ordered:
        if type(item.num_samples) is not int or item.num_samples <= 0:
            raise ValueError(
                f"update {item.id}: num_samples must be a positive integer, not {item.num_samples!r}"
            )
        if set(item.update) != names:
            raise ValueError(f"update {item.id} has tensors {sorted(item.update)}, expected {sorted(names)}")
        for name, value in item.update.items():
            target = global_state.get(name)
            if target is None:
                raise ValueError(f"update {item.id}: tensor {name!r} is not in the global model")
            if value_shape(value) != tuple(target.shape):
                raise ValueError(
                    f"update {item.id}: tensor {name!r} has shape {list(value_shape(value))}, "
                    f"the global model has {list(target.shape)}"
                )
            dtype = value.values.dtype if isinstance(value, SparseRows) else value.dtype
            if dtype != torch.float32 or target.dtype != torch.float32:
                raise ValueError(
                    f"update {item.id}: tensor {name!r} must be float32 in the update and the model"
                )
    return ordered


def _complete(global_state: Mapping[str, Tensor], updated: Mapping[str, Tensor]) -> State:
    """The updated tensors, plus copies of the global tensors that no update touched (e.g. int buffers)."""
    return {
        name: updated[name] if name in updated else global_state[name].clone()
        for name in sorted(global_state)
    }


def _plus(global_state: Mapping[str, Tensor], deltas: Mapping[str, Tensor]) -> State:
    """Add the global tensors into freshly computed deltas, in place."""
    return {name: delta.add_(global_state[name]) for name, delta in deltas.items()}


class Strategy:
    """Base: validate and order the updates, combine their deltas per the subclass, apply to the model."""

    name: ClassVar[str]

    def aggregate(
        self,
        global_state: Mapping[str, Tensor],
        updates: Sequence[WeightedUpdate],
        server_state: Mapping[str, Tensor] | None = None,
    ) -> tuple[State, State | None]:
        ordered = _prepare(global_state, updates)
        return _complete(global_state, self.combine(global_state, ordered)), None

    def combine(self, global_state: Mapping[str, Tensor], ordered: list[WeightedUpdate]) -> State:
        """New values of the tensors the updates carry."""
        raise NotImplementedError


def _names(ordered: list[WeightedUpdate]) -> list[str]:
    return sorted(ordered[0].update)


def _dense(ordered: list[WeightedUpdate], name: str) -> list[Tensor]:
    return [densify(item.update[name]) for item in ordered]


def _sample_weighted(
    ordered: list[WeightedUpdate], global_state: Mapping[str, Tensor] | None = None
) -> State:
    """Sample-weighted mean delta per tensor, or the global tensor plus it when ``global_state`` is given."""
    weights = [item.num_samples for item in ordered]
    return {
        name: weighted_mean(
            _dense(ordered, name), weights, offset=None if global_state is None else global_state[name]
        )
        for name in _names(ordered)
    }


def _leaves_a_row(value: SparseRows | Tensor) -> bool:
    """Whether a value of 2+ dims has a row (dim 0) that is all zero, whatever its encoding."""
    if isinstance(value, SparseRows):
        return value.indices.numel() < value.shape[0]
    return value.dim() >= 2 and touched_rows(value).numel() < value.shape[0]


_REGISTRY: dict[str, type[Strategy]] = {}


def register_strategy(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    def add(cls: type[Strategy]) -> type[Strategy]:
        if name in _REGISTRY:
            raise ValueError(f"aggregation strategy {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def available_strategies() -> list[str]:
    return sorted(_REGISTRY)


def get_strategy(name: str, **params: object) -> Strategy:
    """Create a strategy by name; unknown names and bad parameters raise ``ValueError``."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(
            f"unknown aggregation strategy {name!r}; choose one of {', '.join(available_strategies())}"
        )
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for aggregation strategy {name!r}: {exc}") from None


@register_strategy("fedavg")
class FedAvg(Strategy):
    def combine(self, global_state: Mapping[str, Tensor], ordered: list[WeightedUpdate]) -> State:
        return _sample_weighted(ordered, global_state)


@register_strategy("fedprox")
class FedProx(FedAvg):
    """Aggregates as FedAvg; ``proximal_mu`` is the weight of the proximal term in local training."""

    def __init__(self, mu: float = 0.01) -> None:
        if not mu >= 0:
            raise ValueError(f"FedProx mu must be >= 0, not {mu}")
        self.proximal_mu = float(mu)


@register_strategy("median")
class CoordinateMedian(Strategy):
    def combine(self, global_state: Mapping[str, Tensor], ordered: list[WeightedUpdate]) -> State:
        return _plus(
            global_state, {name: coordinate_median(_dense(ordered, name)) for name in _names(ordered)}
        )


@register_strategy("trimmed_mean")
class TrimmedMean(Strategy):
    def __init__(self, beta: float = 0.1) -> None:
        if not 0 <= beta < 0.5:
            raise ValueError(f"trimmed mean beta must be in [0, 0.5), not {beta}")
        self.beta = float(beta)

    def combine(self, global_state: Mapping[str, Tensor], ordered: list[WeightedUpdate]) -> State:
        deltas = {name: trimmed_mean(_dense(ordered, name), self.beta) for name in _names(ordered)}
        return _plus(global_state, deltas)


@register_strategy("multi_krum")
class MultiKrum(Strategy):
    """Plain mean of the ``m`` updates with the best Krum scores (``m`` defaults to ``n - f``)."""

    def __init__(self, f: int = 1, m: int | None = None) -> None:
        if type(f) is not int or f < 0:
            raise ValueError(f"Krum f (Byzantine updates tolerated) must be an integer >= 0, not {f!r}")
        if m is not None and (type(m) is not int or m < 1):
            raise ValueError(f"Multi-Krum m must be a positive integer, not {m!r}")
        self.f, self.m = f, m

    def selection_size(self, n: int) -> int:
        return self.m if self.m is not None else n - self.f

    def combine(self, global_state: Mapping[str, Tensor], ordered: list[WeightedUpdate]) -> State:
        names = _names(ordered)
        dense = [[densify(item.update[name]) for name in names] for item in ordered]
        chosen = krum_select(pairwise_squared_distances(dense), self.f, self.selection_size(len(ordered)))
        weights = [1.0] * len(chosen)
        return {
            name: weighted_mean([dense[i][k] for i in chosen], weights, offset=global_state[name])
            for k, name in enumerate(names)
        }


@register_strategy("krum")
class Krum(MultiKrum):
    """The single update with the best Krum score."""

    def __init__(self, f: int = 1) -> None:
        super().__init__(f=f, m=1)


@register_strategy("hybrid")
class HybridAveraging(Strategy):
    """FedAvg for dense tensors; per-row sample-weighted averaging for row-sparse ones.

    A tensor is row-sparse if it is named in ``sparse_names`` or, when that is
    not given, if it has two or more dims and some update leaves one of its
    rows exactly unchanged. A dense value of a row-sparse tensor counts as
    touching exactly its non-zero rows, so the result does not depend on how
    each trainer chose to encode its update.

    ``rows`` is the job's rule for a row-sparse tensor: ``"touched"`` averages
    each row over the updates that changed it (a rare token's row moves as far
    as its one trainer moved it); ``"all"`` over every update, as FedAvg does,
    so the model is FedAvg's and only the bytes and the work are sparse.
    """

    def __init__(self, sparse_names: Iterable[str] | None = None, rows: str = "touched") -> None:
        if rows not in ROW_RULES:
            raise ValueError(f"hybrid rows must be one of {ROW_RULES}, not {rows!r}")
        if sparse_names is not None and (
            isinstance(sparse_names, str) or not all(isinstance(n, str) and n for n in sparse_names)
        ):
            raise ValueError("hybrid sparse_names must be a list of tensor names")
        self.sparse_names = None if sparse_names is None else frozenset(sparse_names)
        self.rows = rows

    def _is_row_sparse(self, ordered: list[WeightedUpdate], name: str) -> bool:
        if self.sparse_names is not None:
            return name in self.sparse_names
        # By content, never by how a trainer chose to encode it (fl_node.sparse may pick either).
        return any(_leaves_a_row(item.update[name]) for item in ordered)

    def combine(self, global_state: Mapping[str, Tensor], ordered: list[WeightedUpdate]) -> State:
        weights = [item.num_samples for item in ordered]
        updated: State = {}
        for name in _names(ordered):
            values = [item.update[name] for item in ordered]
            if self._is_row_sparse(ordered, name) and len(value_shape(values[0])) >= 1:
                rows = [v if isinstance(v, SparseRows) else to_sparse_rows(v) for v in values]
                updated[name] = row_sparse_mean(rows, weights, value_shape(values[0]), over=self.rows).add_(
                    global_state[name]
                )
            else:
                updated[name] = weighted_mean(
                    [densify(v) for v in values], weights, offset=global_state[name]
                )
        return updated


class _ServerAdaptive(Strategy):
    """Reddi et al. 2021 server optimizers; state is ``{"m/<name>": ..., "v/<name>": ...}``."""

    yogi: ClassVar[bool]

    def __init__(self, lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        if not lr > 0 or not tau > 0:
            raise ValueError(f"server lr and tau must be > 0 (got lr={lr}, tau={tau})")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"beta1 and beta2 must be in [0, 1) (got {beta1}, {beta2})")
        self.lr, self.beta1, self.beta2, self.tau = float(lr), float(beta1), float(beta2), float(tau)

    def initial_state(self, global_state: Mapping[str, Tensor], names: Iterable[str]) -> State:
        state: State = {}
        for name in names:
            state[f"m/{name}"] = torch.zeros_like(global_state[name])
            state[f"v/{name}"] = torch.full_like(global_state[name], self.tau * self.tau)
        return state

    def aggregate(
        self,
        global_state: Mapping[str, Tensor],
        updates: Sequence[WeightedUpdate],
        server_state: Mapping[str, Tensor] | None = None,
    ) -> tuple[State, State | None]:
        ordered = _prepare(global_state, updates)
        names = _names(ordered)
        state = dict(server_state) if server_state else self.initial_state(global_state, names)
        expected = {f"{kind}/{name}" for name in names for kind in ("m", "v")}
        if set(state) != expected:
            raise ValueError(
                f"server state has keys {sorted(state)[:4]}..., expected m/ and v/ for each of {names}"
            )
        for key, tensor in state.items():
            target = global_state[key[2:]]
            if tuple(tensor.shape) != tuple(target.shape) or tensor.dtype != torch.float32:
                raise ValueError(f"server state {key!r} does not match the model tensor {key[2:]!r}")
        pseudo_gradients = _sample_weighted(ordered)
        new_global: State = {}
        new_state: State = {}
        for name in sorted(global_state):
            if name not in pseudo_gradients:
                new_global[name] = global_state[name].clone()
                continue
            x, m, v = (t.contiguous() for t in (global_state[name], state[f"m/{name}"], state[f"v/{name}"]))
            out_x, out_m, out_v = (torch.empty_like(t) for t in (x, m, v))
            delta = pseudo_gradients[name].view(-1)
            # Chunked like weighted_sum, so each elementwise op stays on one thread and in cache.
            for start in range(0, x.numel(), CHUNK):
                part = slice(start, min(x.numel(), start + CHUNK))
                chunk_m, chunk_v = adaptive_moments(
                    m.view(-1)[part], v.view(-1)[part], delta[part],
                    beta1=self.beta1, beta2=self.beta2, yogi=self.yogi,
                )  # fmt: skip
                out_m.view(-1)[part] = chunk_m
                out_v.view(-1)[part] = chunk_v
                out_x.view(-1)[part] = adaptive_step(
                    x.view(-1)[part], chunk_m, chunk_v, lr=self.lr, tau=self.tau
                )
            new_global[name] = out_x
            new_state[f"m/{name}"], new_state[f"v/{name}"] = out_m, out_v
        return new_global, new_state


@register_strategy("fedadam")
class FedAdam(_ServerAdaptive):
    yogi = False


@register_strategy("fedyogi")
class FedYogi(_ServerAdaptive):
    yogi = True
