"""Per tensor and per round: send an update dense, or as a delta array of the rows it changed.

Embedding tables dominate language and recommendation models, and a trainer
changes only the rows of the tokens or items in its own data. Sparse-aware
hybrid model averaging (SA-HMA; Parallax, Kim et al. 2019, "Parallax:
Sparsity-aware Data Parallel Training of Deep Neural Networks", and the
delta arrays with a dynamic communication choice of the same line of work)
sends those tables as *delta arrays* -- row ids plus the rows' deltas against
the global model -- and averages each row over the trainers that changed it
(:class:`fl_node.aggregate.HybridAveraging`), while dense tensors go as they are.

This module makes the choice per tensor and per round, from two measurements:

* the tensor's *density*: the fraction of rows (dim 0) holding a non-zero
  delta. The codec computes it anyway while checking finiteness, so measuring
  it costs a model whose tensors are all dense nothing extra;
* the *cost* of each encoding, in seconds: the bytes over the job's link
  (``link_bytes_per_s``) plus the time to encode and to decode those bytes,
  from throughputs measured once per process on this machine
  (:func:`measured_costs`): a dense tensor is copied, a delta array gathered
  on encode and scattered on decode, which is slower per byte.

Delta wins when its rows are few; near the break-even density the gather and
scatter time tips the choice to dense. Both encodings are lossless (a delta
array omits only rows that are exactly zero), so the choice changes the bytes,
never the update: aggregation and the committee's scoring give the same result
whichever a trainer picked (``HybridAveraging`` counts a dense value as
touching exactly its non-zero rows).

Privacy. Under DP-SGD every coordinate of the noisy gradient gets Gaussian
noise, rows the node never saw included, and likewise under per-update noise:
the released update is dense, and its density is 1. Sending only the rows the
data touched would reveal which tokens the node holds, which is exactly what
the noise is there to hide; dropping the noised rows would change the
mechanism. We implement the sound option: the choice sees the full density
and sends dense (a job may still pin ``"delta"``; that is lossless too and
sends every noised row, at a few bytes more).

The other sound design, which a job opts into (``public_rows``): each round,
every sparse table keeps only a *public* set of rows, drawn from the job's
seed and the round number alone (the head of the frequency-sorted vocabulary
plus a seeded draw from the rest), never from the data. The update is
projected onto those rows before the mechanism clips it, and the noise on the
other rows is set to zero after it: a data-independent projection followed by
post-processing, so the release keeps its guarantee, and the delta array holds
exactly the public rows. Rows outside the set are dropped openly, by a rule
anyone can recompute, never because the data did not touch them.

Two public rules (the job's ``public_rule``): ``"rotate"`` (the default) keeps the head of
the table for half the rows and a seeded draw from the rest, so that every row gets its turn
over the rounds; ``"head"`` keeps the ``count`` most frequent rows every round (ids
0..count-1 of a frequency-sorted vocabulary: a tokenizer's rank order is public, and the
frequent words are where most of the text's signal sits), so they train every round.

Under DP-SGD a round with public rows trains *only* those rows (:func:`public_rows_model`):
each table becomes a small trainable table of its kept rows in front of a frozen copy of the
global one, so each example's gradient is projected onto the kept rows before it is clipped
and the noise is drawn for the kept rows only. The projection is public and data-independent
and every row that moves is noised, so the release is the same Gaussian mechanism at the same
noise multiplier, sampling rate and steps (the same epsilon); the rows that never move need
no noise. It is also what makes the hybrid cheap: per-example gradients and noise of 1,500
rows instead of 20,000 (``bench/sparse.py``'s federation measures the round times).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F  # noqa: N812

from fl_node.codec import (
    INDEX_BYTES,
    CodecError,
    SparseRows,
    Update,
    densify,
    encode_update,
    touched_rows,
    update_spec,
)

ENCODINGS = ("auto", "dense", "delta")
_CODEC_FORMS = {"dense": "dense", "delta": "sparse_rows"}
# A cross-organisation link: 100 Mbit/s. The job may state its own.
DEFAULT_LINK_BYTES_PER_S = 12.5e6
_MAX_LINK_BYTES_PER_S = 1e12


@dataclass(frozen=True)
class SparsePolicy:
    """A job's rule for update encodings.

    ``encoding``: ``"auto"`` chooses per tensor and round by measured density and
    cost; ``"dense"`` always sends dense (FedAvg's classic form); ``"delta"``
    sends every tensor of two or more dims as a delta array, however dense.
    ``link_bytes_per_s``: the bandwidth the cost model assumes for the bytes.
    ``tables``: the names of the tensors that are sparse tables (candidates for a delta
    array); every other tensor goes dense. None: every tensor of two or more dims.
    """

    encoding: str = "auto"
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S
    # The tensors that may go as delta arrays (the job's sparse tables); None: any of 2+ dims.
    tables: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.tables is not None:
            object.__setattr__(self, "tables", frozenset(self.tables))
        if self.encoding not in ENCODINGS:
            raise ValueError(f"update encoding must be one of {', '.join(ENCODINGS)}, not {self.encoding!r}")
        link = self.link_bytes_per_s
        if not (isinstance(link, int | float) and math.isfinite(link) and 0 < link <= _MAX_LINK_BYTES_PER_S):
            raise ValueError(f"link_bytes_per_s must be a number in (0, 1e12], not {link!r}")


@dataclass(frozen=True)
class Costs:
    """Throughputs (bytes per second) of this machine for each encoding's work, and the link's."""

    copy_bytes_per_s: float  # dense encode, and again dense decode
    gather_bytes_per_s: float  # delta encode (index_select) and decode (index_copy into zeros)
    link_bytes_per_s: float

    def dense_seconds(self, numel: int, itemsize: int = 4) -> float:
        size = numel * itemsize
        return size / self.link_bytes_per_s + 2 * size / self.copy_bytes_per_s

    def delta_seconds(self, rows: int, shape: tuple[int, ...], itemsize: int = 4) -> float:
        row_bytes = math.prod(shape[1:]) * itemsize
        size = rows * (row_bytes + INDEX_BYTES)
        dense_zeros = shape[0] * row_bytes  # decoding writes the rows into a zeroed table
        return (
            size / self.link_bytes_per_s
            + 2 * size / self.gather_bytes_per_s
            + dense_zeros / self.copy_bytes_per_s
        )


def _best_seconds(work, repeats: int = 5) -> float:
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return max(best, 1e-9)


@functools.cache
def _machine_throughputs() -> tuple[float, float]:
    """(copy, gather) bytes per second on this machine, measured once on a 4 MiB table."""
    table = torch.randn(8192, 128)
    rows = torch.arange(0, 8192, 2)
    size = table.numel() * 4
    copy = _best_seconds(lambda: table.clone())
    gather = _best_seconds(lambda: torch.zeros_like(table).index_copy_(0, rows, table.index_select(0, rows)))
    return size / copy, (size / 2) / gather


def measured_costs(link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S) -> Costs:
    copy, gather = _machine_throughputs()
    return Costs(copy_bytes_per_s=copy, gather_bytes_per_s=gather, link_bytes_per_s=link_bytes_per_s)


@dataclass(frozen=True)
class TensorChoice:
    """One tensor's encoding in one update, with what it was chosen from."""

    name: str
    encoding: str  # "dense" or "delta"
    rows: int
    touched: int
    dense_bytes: int
    delta_bytes: int  # what a delta array would take (0 for tensors with fewer than 2 dims)

    @property
    def density(self) -> float:
        return self.touched / self.rows if self.rows else 0.0

    @property
    def sent_bytes(self) -> int:
        return self.delta_bytes if self.encoding == "delta" else self.dense_bytes

    def as_dict(self) -> dict:
        return {
            "encoding": self.encoding,
            "density": round(self.density, 6),
            "bytes": self.sent_bytes,
            "dense_bytes": self.dense_bytes,
        }


def _touched(value: Tensor | SparseRows) -> int:
    if isinstance(value, SparseRows):
        return int(value.indices.numel())
    return int(touched_rows(value).numel()) if value.dim() >= 1 and value.numel() else 0


def choose_encodings(
    update: Update,
    global_state: Mapping[str, Tensor],
    policy: SparsePolicy,
    costs: Costs | None = None,
) -> dict[str, TensorChoice]:
    """The encoding of each tensor of ``update`` (a delta against ``global_state``) under ``policy``.

    Tensors with fewer than two dims always go dense: an 8-byte row id per
    4-byte value never pays; so do tensors the policy does not name as tables.
    """
    spec = update_spec(global_state)
    unknown = sorted(set(update) - set(spec))
    if unknown:
        raise CodecError(f"update tensor(s) not in the global model: {', '.join(unknown)}")
    costs = costs or measured_costs(policy.link_bytes_per_s)
    choices: dict[str, TensorChoice] = {}
    for name in sorted(update):
        value = update[name]
        shape = tuple(int(s) for s in value.shape)
        if shape != tuple(spec[name]):
            raise CodecError(
                f"tensor {name!r} has shape {list(shape)}, the global model has {list(spec[name])}"
            )
        numel = math.prod(shape)
        rows = shape[0] if shape else 1
        touched = _touched(value) if shape else int(bool(densify(value).ne(0).any()))
        if len(shape) < 2 or (policy.tables is not None and name not in policy.tables):
            choices[name] = TensorChoice(name, "dense", rows, touched, numel * 4, 0)
            continue
        delta_bytes = touched * (math.prod(shape[1:]) * 4 + INDEX_BYTES)
        if policy.encoding == "auto":  # never larger than dense: peers bound an update's bytes
            delta = delta_bytes < numel * 4 and costs.delta_seconds(touched, shape) < costs.dense_seconds(
                numel
            )
        else:
            delta = policy.encoding == "delta"
        choices[name] = TensorChoice(
            name, "delta" if delta else "dense", rows, touched, numel * 4, delta_bytes
        )
    return choices


def encode_with_policy(
    update: Update,
    global_state: Mapping[str, Tensor],
    policy: SparsePolicy,
    costs: Costs | None = None,
) -> tuple[bytes, dict[str, TensorChoice]]:
    """Encode ``update`` with the per-tensor encodings :func:`choose_encodings` picks; also return them."""
    choices = choose_encodings(update, global_state, policy, costs)
    forms = {name: _CODEC_FORMS[choice.encoding] for name, choice in choices.items()}
    return encode_update(update, encodings=forms), choices


def encode_for_job(update: Update, global_state: Mapping[str, Tensor], policy: SparsePolicy) -> bytes:
    """The trainer's one call: the update's bytes under the job's policy."""
    return encode_with_policy(update, global_state, policy)[0]


PUBLIC_RULES = ("rotate", "head")


def public_rows(
    shapes: Mapping[str, tuple[int, ...]],
    tables: Iterable[str],
    count: int,
    *,
    seed: int,
    round_: int,
    rule: str = "rotate",
) -> dict[str, Tensor]:
    """The rows each table keeps in round ``round_`` under DP: a public rule, the same on every node.

    ``rule="rotate"``: half the rows are the head of the table (ids 0..count/2-1: the most
    frequent tokens of a frequency-sorted vocabulary), the rest a draw seeded by (seed, round,
    table) from the remaining rows, so that over the rounds every row gets its turn.
    ``rule="head"``: the ``count`` first rows, every round. Either depends on no data.
    """
    if count < 1:
        raise ValueError("public_rows needs a positive count")
    if rule not in PUBLIC_RULES:
        raise ValueError(f"public rule must be one of {', '.join(PUBLIC_RULES)}, not {rule!r}")
    kept: dict[str, Tensor] = {}
    for position, name in enumerate(sorted(tables)):
        if name not in shapes or len(shapes[name]) < 2:
            raise ValueError(f"sparse table {name!r} is not a tensor of 2+ dims of the model")
        rows = int(shapes[name][0])
        if count >= rows:
            kept[name] = torch.arange(rows)
            continue
        if rule == "head":
            kept[name] = torch.arange(count)
            continue
        head = count // 2
        generator = torch.Generator().manual_seed((seed * 1_000_003 + round_) * 1009 + position)
        tail = torch.randperm(rows - head, generator=generator)[: count - head] + head
        kept[name] = torch.cat([torch.arange(head), tail.sort().values])
    return kept


def round_public_rows(
    state: Mapping[str, Tensor],
    tables: Iterable[str],
    count: int,
    *,
    private: bool,
    seed: int,
    round_: int,
    rule: str = "rotate",
) -> dict[str, Tensor] | None:
    """The rows each sparse table of ``state`` keeps in round ``round_`` (numbered from 1, as on
    chain) of a job with ``count`` public rows; None for a job without DP or public rows.

    The one rule of the node's trainer (fl_node.job.training.kept_rows) and of the
    simulator (fl_node.simulate), so that a simulated private sparse run projects its updates as
    a node does.
    """
    if not (private and count):
        return None
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    return public_rows(shapes, tables, count, seed=seed, round_=round_, rule=rule)


class PublicRowsEmbedding(nn.Module):
    """An embedding table of which only ``rows`` train; the others look up a frozen copy.

    ``rows.weight`` (one row per kept id, in the order of ``kept``) is the only parameter, so
    DP-SGD's per-example gradients, clipping and noise cover exactly the kept rows; the frozen
    table is a non-persistent buffer (not in the state dict, never noised, never sent).
    """

    frozen: Tensor
    position: Tensor
    inside: Tensor

    def __init__(self, table: Tensor, kept: Tensor) -> None:
        super().__init__()
        size = table.shape[0]
        self.rows = nn.Embedding.from_pretrained(table[kept].detach().clone(), freeze=False)
        position = torch.zeros(size, dtype=torch.long)
        position[kept] = torch.arange(kept.numel())
        inside = torch.zeros(size, dtype=torch.bool)
        inside[kept] = True
        self.register_buffer("frozen", table.detach().clone(), persistent=False)
        self.register_buffer("position", position, persistent=False)
        self.register_buffer("inside", inside, persistent=False)

    def forward(self, tokens: Tensor) -> Tensor:
        tokens = tokens.long()
        trained = self.rows(self.position[tokens])
        return torch.where(self.inside[tokens].unsqueeze(-1), trained, F.embedding(tokens, self.frozen))


def _plain_embedding(module: nn.Module | None) -> bool:
    return (
        isinstance(module, nn.Embedding)
        and module.padding_idx is None
        and module.max_norm is None
        and not module.scale_grad_by_freq
        and not module.sparse
    )


def public_rows_model(
    model: nn.Module, global_state: Mapping[str, Tensor], kept: Mapping[str, Tensor]
) -> tuple[nn.Module, dict[str, Tensor]] | None:
    """A copy of ``model`` in which only the ``kept`` rows of each table train, and its global state.

    Each table must be the weight of a plain ``nn.Embedding``; None otherwise (the caller then
    trains the whole model and projects its update, :func:`restrict_rows`). :func:`full_update`
    maps the copy's update back onto the model's tensors.
    """
    modules = dict(model.named_modules())
    owners = {name: name.rpartition(".")[0] for name in kept}
    if not kept or any(
        not name.endswith(".weight") or not _plain_embedding(modules.get(owner))
        for name, owner in owners.items()
    ):
        return None
    sub = copy.deepcopy(model)
    sub.load_state_dict(global_state)
    for name, owner in owners.items():
        parent, _, attr = owner.rpartition(".")
        setattr(sub.get_submodule(parent), attr, PublicRowsEmbedding(global_state[name], kept[name]))
    return sub, {k: v.detach().clone() for k, v in sub.state_dict().items()}


def full_update(
    sub_update: Mapping[str, Tensor], global_state: Mapping[str, Tensor], kept: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The update of :func:`public_rows_model`'s copy as an update of the model: each table's delta
    is zero outside its kept rows. Keys in the model's order; non-float tensors as the copy has them."""
    rows_of = {f"{name.rpartition('.')[0]}.rows.weight": name for name in kept}
    by_name = {rows_of.get(k, k): v for k, v in sub_update.items()}
    out: dict[str, Tensor] = {}
    for name, value in global_state.items():
        if name in kept:
            delta = torch.zeros_like(value)
            delta[kept[name]] = by_name[name]
            out[name] = delta
        elif name in by_name:
            out[name] = by_name[name]
    return out


def restrict_rows(update: Mapping[str, Tensor], kept: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``update`` with every row of each table outside its kept rows set to zero (others untouched)."""
    out = dict(update)
    for name, rows in kept.items():
        if name in out:
            mask = torch.zeros(out[name].shape[0], dtype=torch.bool)
            mask[rows] = True
            out[name] = out[name] * mask.view(-1, *([1] * (out[name].dim() - 1))).to(out[name].dtype)
    return out


def decoded_encodings(update: Mapping[str, Tensor | SparseRows]) -> dict[str, str]:
    """Which encoding each tensor of a decoded update arrived in (what the committee records per round)."""
    return {name: "delta" if isinstance(v, SparseRows) else "dense" for name, v in sorted(update.items())}


def round_encodings(
    updates: list[Mapping[str, Tensor | SparseRows]], *, density: bool = True
) -> dict[str, dict[str, float]]:
    """Per tensor over one round's updates: how many came dense and as delta, and their mean density.

    ``density=False`` leaves the density out (it costs a pass over every dense tensor).
    """
    summary: dict[str, dict[str, float]] = {}
    for update in updates:
        for name, value in sorted(update.items()):
            entry = summary.setdefault(name, {"dense": 0, "delta": 0} | ({"density": 0.0} if density else {}))
            entry["delta" if isinstance(value, SparseRows) else "dense"] += 1
            if density:
                rows = value.shape[0] if len(value.shape) else 1
                entry["density"] += (_touched(value) / rows if rows else 0.0) / len(updates)
    for entry in summary.values():
        if density:
            entry["density"] = round(entry["density"], 6)
    return summary
