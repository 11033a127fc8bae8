"""An independent check of every epsilon DeFL claims, under the adjacency it claims (replace-one).

DeFL enforces budgets with its own RDP accountant (``fl_node.privacy``: the replace-one
Poisson-sampled Gaussian's Renyi divergence by trapezoid quadrature). An auditor should not
have to trust that code: this module rebuilds the same releases as Google ``dp-accounting``
events (a Poisson-subsampled Gaussian per DP-SGD step, a plain Gaussian per update-level
release or score) under ``NeighboringRelation.REPLACE_ONE`` and recomputes

* the **PLD epsilon** (privacy loss distributions, pessimistic discretization): a near-exact
  upper bound on the true epsilon under replace-one, so a claim below it under-states the
  loss;
* the composed **RDP curve** at the integer orders, by a second method: scipy's adaptive
  quadrature of the same divergence (dp-accounting's RDP accountant has no replace-one
  Poisson-sampled Gaussian), and in closed form for unsampled releases (2 alpha / s^2). DeFL's
  curve must not be below it, which checks the composition itself (sample rates, steps,
  noise, the per-record bound) apart from the conversion.

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

from fl_node.privacy import ADJACENCY, ORDERS, HistoryEntry, PrivacyHistory, history_rdp, rdp_epsilon

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
    pld_epsilon: float  # dp-accounting's PLD accountant, replace-one
    rdp_curve_ok: bool  # DeFL's RDP curve is at least the independent one at every integer order
    adjacency: str = ADJACENCY

    @property
    def holds(self) -> bool:
        return self.rdp_curve_ok and self.claimed_epsilon >= self.pld_epsilon * (1 - CURVE_TOLERANCE)


def _events(entries: Iterable[HistoryEntry]):
    from dp_accounting import dp_event

    for entry in entries:
        gaussian = dp_event.GaussianDpEvent(entry.noise_multiplier)
        step = (
            gaussian
            if entry.sample_rate >= 1.0
            else dp_event.PoissonSampledDpEvent(entry.sample_rate, gaussian)
        )
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


def independent_rdp_curve(history: PrivacyHistory) -> np.ndarray:
    """The composed replace-one RDP at the integer orders of ``fl_node.privacy.ORDERS``."""
    return sum(
        (e.steps * np.asarray(_step_curve(e.noise_multiplier, e.sample_rate)) for e in history),
        np.zeros(len(INTEGER_ORDERS)),
    )


def pld_epsilon(history: PrivacyHistory, *, delta: float) -> float:
    from dp_accounting import pld
    from dp_accounting.privacy_accountant import NeighboringRelation

    accountant = pld.PLDAccountant(
        NeighboringRelation.REPLACE_ONE, value_discretization_interval=PLD_DISCRETIZATION
    )
    for event in _events(history):
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def audit(history: PrivacyHistory, *, delta: float, claimed_epsilon: float) -> AuditResult:
    """Recompute ``history``'s privacy independently and compare it with ``claimed_epsilon``."""
    logging.getLogger("absl").setLevel(logging.ERROR)  # its series warnings are not findings
    if not history.entries:
        return AuditResult(claimed_epsilon, 0.0, 0.0, True)
    ours = np.asarray(history_rdp(history), dtype=float)
    at_integers = ours[[list(ORDERS).index(a) for a in INTEGER_ORDERS]]
    theirs = independent_rdp_curve(history)
    curve_ok = bool(np.all(at_integers >= theirs * (1 - CURVE_TOLERANCE) - 1e-12))
    return AuditResult(
        claimed_epsilon=claimed_epsilon,
        defl_rdp_epsilon=rdp_epsilon(history, delta=delta),
        pld_epsilon=pld_epsilon(history, delta=delta),
        rdp_curve_ok=curve_ok,
    )


def assert_claim_holds(history: PrivacyHistory, *, delta: float, claimed_epsilon: float) -> AuditResult:
    result = audit(history, delta=delta, claimed_epsilon=claimed_epsilon)
    if not result.rdp_curve_ok:
        raise UnderstatedEpsilon("DeFL's RDP curve is below the independent replace-one curve at some order")
    if not result.holds:
        raise UnderstatedEpsilon(
            f"claimed epsilon {claimed_epsilon:.6g} is below dp-accounting's PLD epsilon "
            f"{result.pld_epsilon:.6g} under {ADJACENCY} adjacency"
        )
    return result
