"""An independent check of every epsilon DeFL claims, with Google's ``dp-accounting``.

DeFL enforces budgets with Opacus's RDP accountant (``fl_node.privacy``). An auditor should
not have to trust that code: this module rebuilds the same releases as ``dp_accounting``
events (a Poisson-subsampled Gaussian per DP-SGD step, a plain Gaussian per update-level
release or score) and recomputes

* the composed **RDP curve** at the integer orders (Mironov, Talwar and Zhang 2019's exact
  binomial expansion, implemented independently): DeFL's curve must not be below it, which
  checks the composition itself (sample rates, steps, noise, sensitivity) apart from the
  conversion. At fractional orders dp-accounting's series is an upper bound looser than
  Opacus's (which matches numerical integration of the Renyi divergence), so those orders
  are no test;
* the **PLD epsilon** (privacy loss distributions, pessimistic discretization): a near-exact
  upper bound on the true epsilon, so a claim below it would under-state the loss.

``audit`` returns both figures; ``assert_claim_holds`` raises ``UnderstatedEpsilon`` when a
claim is below either. Tests run it on what the simulator and the node record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from opacus.accountants.rdp import RDPAccountant

from fl_node.privacy import HistoryEntry, PrivacyHistory, history_rdp, rdp_epsilon

# Relative slack for floating-point differences between two implementations of one formula.
CURVE_TOLERANCE = 1e-6
# The PLD's discretization interval: small enough that its pessimistic bound is tight.
PLD_DISCRETIZATION = 1e-4


class UnderstatedEpsilon(AssertionError):
    """A claimed epsilon is below what the independent accountant computes."""


@dataclass(frozen=True)
class AuditResult:
    claimed_epsilon: float
    defl_rdp_epsilon: float  # DeFL's own RDP figure for the history
    pld_epsilon: float  # dp-accounting's PLD accountant
    rdp_curve_ok: bool  # DeFL's RDP curve is at least dp-accounting's at every order

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


def independent_rdp_curve(history: PrivacyHistory) -> np.ndarray:
    """dp-accounting's composed RDP at Opacus's orders."""
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant(orders=list(RDPAccountant.DEFAULT_ALPHAS))
    for event in _events(history):
        accountant.compose(event)
    return np.asarray(accountant._rdp, dtype=float)  # noqa: SLF001 (the curve itself is the check)


def pld_epsilon(history: PrivacyHistory, *, delta: float) -> float:
    from dp_accounting import pld

    accountant = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    for event in _events(history):
        accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def audit(history: PrivacyHistory, *, delta: float, claimed_epsilon: float) -> AuditResult:
    """Recompute ``history``'s privacy independently and compare it with ``claimed_epsilon``."""
    logging.getLogger("absl").setLevel(logging.ERROR)  # its series warnings are not findings
    if not history.entries:
        return AuditResult(claimed_epsilon, 0.0, 0.0, True)
    ours = np.asarray(history_rdp(history), dtype=float)
    theirs = independent_rdp_curve(history)
    orders = np.asarray(RDPAccountant.DEFAULT_ALPHAS, dtype=float)
    exact = (orders == np.round(orders)) & np.isfinite(theirs)
    curve_ok = bool(np.all(ours[exact] >= theirs[exact] * (1 - CURVE_TOLERANCE) - 1e-12))
    return AuditResult(
        claimed_epsilon=claimed_epsilon,
        defl_rdp_epsilon=rdp_epsilon(history, delta=delta),
        pld_epsilon=pld_epsilon(history, delta=delta),
        rdp_curve_ok=curve_ok,
    )


def assert_claim_holds(history: PrivacyHistory, *, delta: float, claimed_epsilon: float) -> AuditResult:
    result = audit(history, delta=delta, claimed_epsilon=claimed_epsilon)
    if not result.rdp_curve_ok:
        raise UnderstatedEpsilon("DeFL's RDP curve is below dp-accounting's at some order")
    if not result.holds:
        raise UnderstatedEpsilon(
            f"claimed epsilon {claimed_epsilon:.6g} is below dp-accounting's PLD epsilon {result.pld_epsilon:.6g}"
        )
    return result
