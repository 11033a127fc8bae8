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
* A sign vote over the round's submissions (after the robust learning rate of Ozdayi et al.
  2021, "Defending against Backdoors in Federated Learning with Robust Learning Rate", and
  signSGD's majority vote, Bernstein et al. 2019): every coordinate of the aggregate's step
  whose direction a strict majority of the submitted updates does not back is zeroed (or
  reversed). A trigger backdoor lives in weights that honest data never
  moves (a corner patch that is black in every clean image): honest updates leave them at
  exactly 0, so a minority of attackers can never carry them, whoever the committee accepted.
  The vote is integer arithmetic over the updates on chain: every honest node gets the same mask.

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


def _voting(updates: Iterable[Mapping[str, torch.Tensor]], names: list[str]) -> list[dict[str, torch.Tensor]]:
    """The voters' signs (int8) per tensor. An all-zero update abstains: it moves nothing, so it
    backs no direction (a free rider must not raise the majority the honest trainers have to form)."""
    voters = []
    for update in updates:
        dense = {name: densify(update[name]) for name in names}
        if any(bool(value.any()) for value in dense.values()):
            voters.append({name: torch.sign(value).to(torch.int8) for name, value in dense.items()})
    return voters


def sign_majority_mask(
    step: Mapping[str, torch.Tensor],
    updates: Iterable[Mapping[str, torch.Tensor]],
    *,
    mode: str = "zero",
    witnesses: Iterable[Mapping[str, torch.Tensor]] = (),
) -> dict[str, torch.Tensor] | None:
    """Per coordinate of the aggregate's ``step``, a factor (float32): 1 where more voting
    ``updates`` move that coordinate in the step's direction than leave it at exactly 0, and more
    than move it the other way; 0 ("zero") or -1 ("flip", as Ozdayi et al.'s robust learning rate)
    elsewhere. None without voters.

    Comparing the step's backers with each of the other two camps (rather than the net sum of
    signs against a fixed threshold, as the robust learning rate does) keeps a minority of
    contrarians from vetoing what the honest trainers agree on, and still refuses what only a
    minority moves: honest updates that leave a coordinate at exactly 0 count against it.
    ``witnesses`` (updates the committee judged harmful) count only where they are exactly 0: a
    sabotaging update neither backs nor opposes, but an honest one wrongly judged harmful still
    testifies that its data never moves a trigger's weights."""
    if mode not in ("flip", "zero"):
        raise ValueError(f"sign majority mode must be 'flip' or 'zero', got {mode!r}")
    names = sorted(step)
    voters = _voting(updates, names)
    if not voters:
        return None
    others = _voting(witnesses, names)
    other = torch.tensor(-1.0 if mode == "flip" else 0.0)
    mask = {}
    for name in names:
        direction = torch.sign(densify(step[name])).to(torch.int8)
        backing = torch.zeros(direction.shape, dtype=torch.int32)
        opposing = torch.zeros(direction.shape, dtype=torch.int32)
        still = torch.zeros(direction.shape, dtype=torch.int32)
        for voter in voters:
            backing += (voter[name] == direction) & (direction != 0)
            opposing += (voter[name] == -direction) & (direction != 0)
            still += voter[name] == 0
        for witness in others:
            still += witness[name] == 0
        mask[name] = torch.where((backing > still) & (backing > opposing), torch.tensor(1.0), other)
    return mask


def median_norm(updates: Iterable[Mapping[str, torch.Tensor]]) -> float | None:
    """The median L2 norm of the non-zero, finite ``updates`` (lower middle for an even count; None
    if there is none): FLAME's adaptive clipping bound (Nguyen et al. 2022), which a minority of
    boosted updates cannot raise."""
    norms = sorted(n for n in (update_norm(u) for u in updates) if 0.0 < n < math.inf)
    return norms[(len(norms) - 1) // 2] if norms else None


def clip_update(update: Mapping[str, torch.Tensor], bound: float) -> dict[str, torch.Tensor]:
    """``update`` scaled down to L2 norm ``bound`` when it is longer (float tensors; others as they are)."""
    norm = update_norm(update)
    if norm <= bound:
        return dict(update)
    factor = bound / norm
    return {k: densify(v) * factor if densify(v).is_floating_point() else v for k, v in update.items()}


def apply_sign_majority(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    updates: Iterable[Mapping[str, torch.Tensor]],
    *,
    mode: str = "zero",
    witnesses: Iterable[Mapping[str, torch.Tensor]] = (),
) -> dict[str, torch.Tensor]:
    """``new`` with its step from ``old`` masked by :func:`sign_majority_mask` over ``updates``
    (and ``witnesses``): ``old + mask * (new - old)`` for every tensor the updates carry; the rest
    of ``new`` as it is."""
    updates = list(updates)
    if not updates:
        return dict(new)
    names = sorted(updates[0])
    step = {name: new[name] - old[name] for name in names}
    mask = sign_majority_mask(step, updates, mode=mode, witnesses=witnesses)
    if mask is None:
        return dict(new)
    out = dict(new)
    for name in names:
        out[name] = old[name] + step[name] * mask[name].to(step[name].dtype) + 0.0
    return out


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
