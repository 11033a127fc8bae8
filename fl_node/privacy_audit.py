"""An independent check of every epsilon DeFL claims, under the adjacency it claims.

DeFL enforces budgets with its own RDP accountant (``fl_node.privacy``: under replace-one the
Poisson-sampled Gaussian's Renyi divergence by trapezoid quadrature, under add-remove Opacus's
analysis). An auditor should not have to trust that code: this module rebuilds the same
releases as Google ``dp-accounting`` events (a Poisson-subsampled Gaussian per DP-SGD step, a
plain Gaussian per update-level release, score or count) under the claimed
``NeighboringRelation`` and recomputes

* the **PLD epsilon** (privacy loss distributions, pessimistic discretization): a near-exact
  upper bound on the true epsilon, so a claim below it under-states the loss;
* the composed **RDP curve** at the integer orders, by a second method: under replace-one
  scipy's adaptive quadrature of the same divergence (dp-accounting's RDP accountant has no
  replace-one Poisson-sampled Gaussian), under add-remove dp-accounting's RDP accountant, and
  in closed form for unsampled releases (2 alpha / s^2). DeFL's curve must not be below it,
  which checks the composition itself (sample rates, steps, noise, the per-record bound)
  apart from the conversion.

``audit`` returns both figures; ``assert_claim_holds`` raises ``UnderstatedEpsilon`` when a
claim is below either. Tests and benchmarks run it on what the simulator and the node record.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fl_node.privacy import (
    ADD_REMOVE,
    ORDERS,
    REPLACE_ONE,
    HistoryEntry,
    PrivacyHistory,
    check_adjacency,
    gaussian_event,
    history_rdp,
    neighboring_relation,
    rdp_epsilon,
)

# Relative slack for floating-point differences between two implementations of one formula.
CURVE_TOLERANCE = 1e-6
# The PLD's discretization interval: small enough that its pessimistic bound is tight.
PLD_DISCRETIZATION = 1e-4
INTEGER_ORDERS = tuple(a for a in ORDERS if a == round(a))


class UnderstatedEpsilon(AssertionError):
    """A claimed epsilon is below what the independent accountant computes."""


@dataclass(frozen=True)
class AuditResult:
    claimed_epsilon: float
    defl_rdp_epsilon: float  # DeFL's own RDP figure for the history
    pld_epsilon: float  # dp-accounting's PLD accountant, at the adjacency
    rdp_curve_ok: bool  # DeFL's RDP curve is at least the independent one at every integer order
    adjacency: str = REPLACE_ONE

    @property
    def holds(self) -> bool:
        return self.rdp_curve_ok and self.claimed_epsilon >= self.pld_epsilon * (1 - CURVE_TOLERANCE)


def _events(entries: Iterable[HistoryEntry], adjacency: str):
    from dp_accounting import dp_event

    for entry in entries:
        step = gaussian_event(entry.noise_multiplier, entry.sample_rate, adjacency)
        yield dp_event.SelfComposedDpEvent(step, entry.steps)


@lru_cache(maxsize=256)
def _step_curve(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """One step's replace-one RDP at the integer orders, by adaptive quadrature (or closed form)."""
    if sample_rate >= 1.0:
        return tuple(2.0 * a / noise_multiplier**2 for a in INTEGER_ORDERS)
    from scipy import integrate  # type: ignore[import-untyped]

    sigma, q = noise_multiplier, sample_rate
    scale = 1.0 / (2.0 * sigma**2)
    norm = -0.5 * math.log(2.0 * math.pi * sigma**2)

    def log_density(x: float, shift: float) -> float:
        return norm + float(
            np.logaddexp(math.log1p(-q) - x * x * scale, math.log(q) - (x - shift) ** 2 * scale)
        )

    curve = []
    for order in INTEGER_ORDERS:
        # Integrate around the integrand's peak (it sits between 0 and 2 alpha) in pieces.
        edges = [-1.0 - 14.0 * sigma, -1.0, 0.0, 1.0, order, 2.0 * order, 2.0 * order + 2.0 + 14.0 * sigma]
        peak = max(order * log_density(x, 1.0) + (1 - order) * log_density(x, -1.0) for x in edges)

        def integrand(x: float, order: float = order, peak: float = peak) -> float:
            return math.exp(order * log_density(x, 1.0) + (1 - order) * log_density(x, -1.0) - peak)

        total = sum(
            integrate.quad(integrand, a, b, epsabs=0.0, epsrel=1e-12, limit=400)[0]
            for a, b in zip(edges, edges[1:], strict=False)
        )
        curve.append(max((math.log(total) + peak) / (order - 1.0), 0.0))
    return tuple(curve)


def independent_rdp_curve(history: PrivacyHistory, adjacency: str = REPLACE_ONE) -> np.ndarray:
    """The composed RDP under ``adjacency`` at the integer orders of ``fl_node.privacy.ORDERS``."""
    if check_adjacency(adjacency) == ADD_REMOVE:
        return _add_remove_curve(history)
    return sum(
        (e.steps * np.asarray(_step_curve(e.noise_multiplier, e.sample_rate)) for e in history),
        np.zeros(len(INTEGER_ORDERS)),
    )


def _add_remove_curve(history: PrivacyHistory) -> np.ndarray:
    """dp-accounting's RDP accountant under ADD_OR_REMOVE_ONE (its own analysis of the sampled
    Gaussian, Mironov, Talwar and Zhang 2019), at the integer orders."""
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant(
        orders=list(INTEGER_ORDERS), neighboring_relation=neighboring_relation(ADD_REMOVE)
    )
    for event in _events(history, ADD_REMOVE):
        accountant.compose(event)
    return np.asarray(accountant._rdp, dtype=float)  # the composed curve: no public accessor


def pld_epsilon(history: PrivacyHistory, *, delta: float, adjacency: str = REPLACE_ONE) -> float:
    from dp_accounting import pld

    accountant = pld.PLDAccountant(
        neighboring_relation(adjacency), value_discretization_interval=PLD_DISCRETIZATION
    )
    for event in _events(history, adjacency):
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def audit(
    history: PrivacyHistory, *, delta: float, claimed_epsilon: float, adjacency: str = REPLACE_ONE
) -> AuditResult:
    """Recompute ``history``'s privacy independently and compare it with ``claimed_epsilon``."""
    logging.getLogger("absl").setLevel(logging.ERROR)  # its series warnings are not findings
    if not history.entries:
        return AuditResult(claimed_epsilon, 0.0, 0.0, True, adjacency)
    ours = np.asarray(history_rdp(history, adjacency), dtype=float)
    at_integers = ours[[list(ORDERS).index(a) for a in INTEGER_ORDERS]]
    theirs = independent_rdp_curve(history, adjacency)
    curve_ok = bool(np.all(at_integers >= theirs * (1 - CURVE_TOLERANCE) - 1e-12))
    return AuditResult(
        claimed_epsilon=claimed_epsilon,
        defl_rdp_epsilon=rdp_epsilon(history, delta=delta, adjacency=adjacency),
        pld_epsilon=pld_epsilon(history, delta=delta, adjacency=adjacency),
        rdp_curve_ok=curve_ok,
        adjacency=adjacency,
    )


def assert_claim_holds(
    history: PrivacyHistory, *, delta: float, claimed_epsilon: float, adjacency: str = REPLACE_ONE
) -> AuditResult:
    result = audit(history, delta=delta, claimed_epsilon=claimed_epsilon, adjacency=adjacency)
    if not result.rdp_curve_ok:
        raise UnderstatedEpsilon(f"DeFL's RDP curve is below the independent {adjacency} curve at some order")
    if not result.holds:
        raise UnderstatedEpsilon(
            f"claimed epsilon {claimed_epsilon:.6g} is below dp-accounting's PLD epsilon "
            f"{result.pld_epsilon:.6g} under {adjacency} adjacency"
        )
    return result
