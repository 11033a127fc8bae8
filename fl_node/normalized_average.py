"""Normalized averaging for unequal local work (FedNova).

Wang, Liu, Liang, Joshi, Poor 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization" (NeurIPS): when trainers run different numbers of local
steps, FedAvg's average of their deltas is biased towards the trainers that ran more (it
minimises a surrogate objective weighted by ``p_i * tau_i``, not the true ``p_i``), and
weighting by samples processed makes that worse. FedNova divides each trainer's delta by the
length of its local work, averages the normalized deltas with the data weights ``p_i``, and
scales the result by the effective work ``tau_eff = sum_i p_i a_i``::

    x_new = x + tau_eff * sum_i p_i * delta_i / a_i

``a_i`` is the L1 norm of the trainer's aggregation vector: ``tau_i`` for plain SGD, and with
PyTorch's heavy-ball momentum ``rho`` (a fresh buffer per round, ``buf = rho*buf + g``)
``a_i = sum_{k=1..tau_i} (1 - rho^k) / (1 - rho)`` (the paper's section 4 / its reference
optimizer's ``local_normalizing_vec``). With equal work every ``a_i`` is the same and the result
is exactly FedAvg with weights ``p_i`` (this module then uses FedAvg's own weights, so the bytes
match too).

Trust: ``steps`` is what a trainer reports; it is clamped to ``[1, max_steps]`` (the job's AIMD
bound, as :func:`fl_node.scheduler.processed_samples`), so a trainer claiming few steps cannot
blow its delta up by a large factor beyond what the job allows (the factor is at most
``tau_eff / a(1)``), and one claiming many cannot shrink others'. ``num_samples`` is the data
weight ``p_i`` (the trainer's dataset size, not the samples it processed: FedNova's point is
that work must not enter the weights).

Learning-rate cap (``cap_steps``): a trainer that runs more steps than the job's nominal
``cap_steps`` trains at ``lr * a(cap_steps) / a_i`` (:func:`capped_lr`), so no trainer's local
trajectory is longer than the nominal one's: more steps buy a less noisy estimate of the same
move rather than a longer drift away from the global model (at lr 0.1, 4x the local work made
the last rounds swing by 2-3 points even under plain FedAvg). Its delta is then
``-lr * min(a_i, a(cap_steps)) * mean gradient``, so :func:`nova_weights` normalizes by that
capped work norm; with every trainer at or above the cap the factors are FedAvg's ``p_i``.

Pure and deterministic: updates are validated and sorted by id as in :mod:`fl_node.aggregate`
and reduced with its bit-exact :func:`fl_node.aggregate.weighted_sum`; the per-update factors
are computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

# The validation and completion of fl_node.aggregate (its trust-boundary checks: ids, names,
# shapes, dtypes, positive integer sample counts). Reused rather than copied so they cannot drift.
from fl_node.aggregate import WeightedUpdate, _complete, _prepare, weighted_sum
from fl_node.codec import Update, densify

State = dict[str, Tensor]


@dataclass(frozen=True)
class WorkUpdate:
    """An update with its data weight (``num_samples``: the trainer's dataset size) and its local steps."""

    update: Update
    num_samples: int
    steps: int
    id: str


def clamp_steps(steps: int, *, max_steps: int) -> int:
    """A reported step count bounded to ``[1, max_steps]`` (the job's AIMD bound)."""
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise ValueError(f"steps must be an integer, got {steps!r}")
    return min(max(steps, 1), max_steps)


def work_norm(steps: int, momentum: float = 0.0) -> float:
    """``a_i``: the L1 norm of the aggregation vector of ``steps`` local SGD steps.

    ``steps`` for plain SGD; with heavy-ball momentum ``rho`` each gradient keeps acting in
    every later step, so ``a = sum_{k=1..steps} (1 - rho^k) / (1 - rho)``.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not (isinstance(momentum, int | float) and 0 <= momentum < 1):
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if momentum == 0:
        return float(steps)
    rho = float(momentum)
    # Closed form of the sum: (steps - rho * (1 - rho^steps) / (1 - rho)) / (1 - rho).
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


def capped_lr(lr: float, steps: int, *, cap_steps: int, momentum: float = 0.0) -> float:
    """The local learning rate of a trainer running ``steps`` under the cap (see the module doc).

    ``lr`` up to ``cap_steps`` steps, then ``lr * a(cap_steps) / a(steps)``: the trajectory's
    length (lr times the work norm) never exceeds the nominal work's.
    """
    cap = work_norm(cap_steps, momentum)
    norm = work_norm(steps, momentum)
    return lr if norm <= cap else lr * (cap / norm)


def nova_weights(
    num_samples: Sequence[int],
    steps: Sequence[int],
    *,
    momentum: float = 0.0,
    tau_eff: float | None = None,
    cap_steps: int | None = None,
) -> tuple[list[float], float]:
    """The factors ``tau_eff * p_i / a_i`` applied to each delta, and ``tau_eff``.

    ``tau_eff`` None is FedNova's default ``sum_i p_i a_i``; a given value is a server step
    size (any positive value keeps the objective consistent, Wang et al. 2020 section 4), e.g.
    the work norm of the job's nominal steps. When every trainer ran the same steps and
    ``tau_eff`` is their norm (or None), the factors are FedAvg's ``p_i`` exactly (as
    :func:`fl_node.aggregate.weighted_mean` computes them), so normalized averaging is FedAvg.
    ``cap_steps``: the trainers ran under the learning-rate cap (:func:`capped_lr`), so each
    delta's work norm is ``min(a_i, a(cap_steps))``.
    """
    if tau_eff is not None and not (
        isinstance(tau_eff, int | float) and math.isfinite(tau_eff) and tau_eff > 0
    ):
        raise ValueError(f"tau_eff must be a positive number, got {tau_eff!r}")
    if not num_samples or len(num_samples) != len(steps):
        raise ValueError("need as many step counts as sample counts, and at least one")
    total = float(sum(num_samples))
    if not total > 0:
        raise ValueError("sample counts must sum to a positive number")
    p = [n / total for n in num_samples]
    norms = [work_norm(s, momentum) for s in steps]
    if cap_steps is not None:
        cap = work_norm(cap_steps, momentum)
        norms = [min(a, cap) for a in norms]
    mean_work = math.fsum(pi * ai for pi, ai in zip(p, norms, strict=True))
    if len(set(norms)) == 1 and (tau_eff is None or tau_eff == norms[0]):
        return p, norms[0]
    tau_eff = mean_work if tau_eff is None else float(tau_eff)
    return [pi * (tau_eff / ai) for pi, ai in zip(p, norms, strict=True)], tau_eff


def normalized_average(
    global_state: Mapping[str, Tensor],
    updates: Sequence[WorkUpdate],
    *,
    max_steps: int,
    momentum: float = 0.0,
    tau_eff: float | None = None,
    cap_steps: int | None = None,
) -> State:
    """The new global model by FedNova from deltas of unequal local work (see the module doc).

    ``max_steps`` is the job's bound on a round's local steps; reported steps are clamped to it.
    ``momentum`` is the trainers' SGD momentum (the job's, not a per-update claim).
    ``tau_eff``: the server step (see :func:`nova_weights`); None is FedNova's ``sum_i p_i a_i``.
    ``cap_steps``: the trainers ran under the learning-rate cap of that many nominal steps.
    Raises ValueError on malformed updates, as :class:`fl_node.aggregate.FedAvg` does.
    """
    steps_by_id = {}
    for item in updates:
        steps_by_id[item.id] = clamp_steps(item.steps, max_steps=max_steps)
    ordered = _prepare(
        global_state, [WeightedUpdate(item.update, item.num_samples, item.id) for item in updates]
    )
    factors, _ = nova_weights(
        [item.num_samples for item in ordered],
        [steps_by_id[item.id] for item in ordered],
        momentum=momentum,
        tau_eff=tau_eff,
        cap_steps=cap_steps,
    )
    names = sorted(ordered[0].update)
    combined = {
        name: weighted_sum(
            [densify(item.update[name]) for item in ordered], factors, offset=global_state[name]
        )
        for name in names
    }
    return _complete(global_state, combined)
