"""Defenses of the round engine against a hostile minority of trainers (issue 14).

These are the checks every honest node applies before it scores or aggregates, mirrored
from the contract where the chain enforces them:

* A content hash counts once per round: the first submission keeps it (the contract
  reverts a second ``submitUpdate`` with the same hash), so a copier gets nothing and a
  copied update is not weighted twice.
* A claimed sample count is capped at the participant's registered dataset size (the
  contract bounds ``samples`` by it), so nobody can make FedAvg its own model.
* An update whose L2 norm exceeds the job's bound, or that is not finite, scores 0 from
  every honest committee member: amplified or noise updates never reach the median.

:func:`get_strategy` adds ``multi_krum_adaptive`` (Multi-Krum for the few updates a committee
accepts) to fl_node.aggregate's strategies, for simulations only: it is not registered, so a
job's strategy choices do not depend on whether this module was imported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

import torch

from fl_node.aggregate import MultiKrum, Strategy, WeightedUpdate, weighted_mean
from fl_node.aggregate import get_strategy as get_job_strategy
from fl_node.codec import Update, densify
from fl_node.committee import MAX_SCORE

T = TypeVar("T")


def update_norm(update: Update | Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of all floating-point tensors of a decoded update (inf when any value is not finite)."""
    total = 0.0
    for value in update.values():
        value = densify(value)
        if not value.is_floating_point():
            continue
        wide = value.detach().to(torch.float64)
        if not bool(torch.isfinite(wide).all()):
            return math.inf
        total += float((wide * wide).sum())
    return math.sqrt(total)


def within_norm_bound(update: Update | Mapping[str, torch.Tensor], bound: float | None) -> bool:
    """Whether an update may be scored at all: its norm is finite and at most ``bound`` (None: no bound)."""
    norm = update_norm(update)
    return math.isfinite(norm) and (bound is None or norm <= bound)


def cap_samples(claimed: int, registered: int) -> int:
    """The weight an update gets: its claimed sample count, at most the registered dataset size."""
    if claimed < 1:
        raise ValueError(f"a sample count must be positive, got {claimed}")
    return min(int(claimed), int(registered))


def first_by_hash(submissions: Iterable[tuple[T, str]]) -> tuple[list[T], list[T]]:
    """Split submissions ``(owner, content_hash)`` in arrival order into the kept (first of each
    hash) and the dropped (later repeats)."""
    seen: set[str] = set()
    kept: list[T] = []
    dropped: list[T] = []
    for owner, digest in submissions:
        (dropped if digest in seen else kept).append(owner)
        seen.add(digest)
    return kept, dropped


def colluding_scores(trainers: Iterable[str], accomplices: set[str]) -> dict[str, int]:
    """What a hostile committee member submits: the top score for its accomplices, 0 for the rest."""
    return {t: MAX_SCORE if t in accomplices else 0 for t in trainers}


class AdaptiveMultiKrum(MultiKrum):
    """Multi-Krum for a committee's few accepted updates: Krum needs ``n >= 2f + 3``, and a round
    may accept fewer (copies dropped, low medians). Uses the largest ``f`` (up to the configured
    one) that ``n`` allows and always drops at least the least central update; averages all of
    them below 3 updates, where Krum's scores are undefined."""

    def combine(self, global_state: Mapping[str, torch.Tensor], ordered: list[WeightedUpdate]):
        n = len(ordered)
        if n < 3:
            return {
                name: weighted_mean(
                    [densify(u.update[name]) for u in ordered], [1.0] * n, offset=global_state[name]
                )
                for name in sorted(ordered[0].update)
            }
        f = max(0, min(self.f, (n - 3) // 2))
        return MultiKrum(f=f, m=n - max(f, 1)).combine(global_state, ordered)


AdaptiveMultiKrum.name = "multi_krum_adaptive"


def get_strategy(name: str, **params: object) -> Strategy:
    """A job strategy by name (fl_node.aggregate), or ``multi_krum_adaptive``."""
    if name == AdaptiveMultiKrum.name:
        try:
            return AdaptiveMultiKrum(**params)
        except TypeError as exc:
            raise ValueError(f"bad parameters for aggregation strategy {name!r}: {exc}") from None
    return get_job_strategy(name, **params)
