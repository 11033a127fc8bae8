"""Differential-privacy accounting, per-dataset budgets and the update-level Gaussian mechanism.

**Adjacency: one per dataset, matching what is published about it** (docs/PRIVACY.md).

* **add-remove** (``ADD_REMOVE``): neighbours differ by one record added or removed. It holds
  only where the size is no exact public value: a dataset registers a DP count of its records
  (``fl_node.dp_count``: the count is its first release, charged here like any other), and
  every public number follows from that count.
* **replace-one** (``REPLACE_ONE``): neighbours have the same size and differ in one record. A
  dataset registered with its exact size (before DP counts) is accounted so for good: its size
  is public, and add/remove would protect nothing an observer cannot already tell apart.

State and formulas are kept apart, as in Opacus's accountants:

* ``PrivacyHistory`` only records ``(noise_multiplier, sample_rate, steps)`` runs of the
  Poisson-subsampled Gaussian mechanism (Abadi et al. 2016). ``noise_multiplier`` is the
  noise's standard deviation over the per-record bound ``r`` of the release: one record
  contributes at most ``r`` (in L2) to a sampled sum. The two adjacencies read it so:

  - replace-one: neighbouring sums differ by at most ``2 r``; the release of neighbouring
    datasets is dominated by ``(1-q) N(0, s^2) + q N(1, s^2)`` against
    ``(1-q) N(0, s^2) + q N(-1, s^2)`` (dp-accounting's ``REPLACE_ONE``); Zhu, Dong and Wang
    2022 (the dominating pairs of Poisson subsampling under substitution) and Lebeda, Regehr,
    Kamath and Steinke 2024 ("Avoiding Pitfalls for Privacy Accounting of Subsampled
    Mechanisms under Composition").
  - add-remove: a sampled step's sums differ by at most ``r``: ``(1-q) N(0, s^2) + q N(1, s^2)``
    against ``N(0, s^2)`` (Mironov, Talwar and Zhang 2019; Opacus's and dp-accounting's
    ``ADD_OR_REMOVE_ONE``).
  - an unsampled release (``q = 1``) is read as two Gaussians ``2 r`` apart under both: that is
    what the releases that use it move by when one record is added or removed as well (a
    whole clipped update: anywhere in the C-ball; a count over ``r = 1/2``: by 1).
* ``epsilon(history, delta=..., accountant=...)`` is a pure function. ``"rdp"`` is the Renyi
  DP of that pair (Mironov 2017), computed by quadrature of the Renyi divergence (no closed
  form exists for two mixtures: :func:`replace_one_rdp`), composed (RDP adds up per order)
  and converted to (epsilon, delta) with Opacus's conversion (Balle et al. 2020), which holds
  for any RDP curve. ``"pld"`` is Google dp-accounting's privacy loss distribution under
  ``REPLACE_ONE`` (pessimistic, tighter). Budgets are enforced and noise calibrated with RDP:
  its per-order composition is what the plan's argument for any mix of training and scoring
  rounds rests on (``fl_node.privacy_plan``); PLD is reported beside it and audits it
  (``fl_node.privacy_audit``).
* ``BudgetLedger`` holds one budget's cap and history. Spending composes the whole recorded
  history with RDP instead of summing per-job epsilons, so the total is valid for any sequence
  of rounds and jobs and far tighter than adding (epsilon, delta) pairs.
* ``UpdateGaussianMechanism`` clips a whole model update and adds Gaussian noise (in the
  style of DP-FedAvg, McMahan et al. 2018), accounted at the record level: one record can move
  the clipped update anywhere in the C-ball, so its per-record bound is ``C`` (neighbours 2C
  apart).
* Every release's noise comes from a secret stream (``fl_node.secure_random``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import torch
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.rdp import RDPAccountant

from fl_node.secure_random import NoiseSource, SecureRandom


class PrivacyBudgetExceeded(Exception):
    """A request would spend more privacy than a dataset's cap allows; nothing was spent."""

    def __init__(
        self, *, requested_epsilon: float, cap_epsilon: float, spent_epsilon: float, delta: float
    ) -> None:
        self.requested_epsilon = requested_epsilon
        self.cap_epsilon = cap_epsilon
        self.spent_epsilon = spent_epsilon
        self.delta = delta
        super().__init__(
            f"privacy budget exceeded: this request would bring epsilon to {requested_epsilon:.4g} "
            f"(already spent {spent_epsilon:.4g}) but the cap is {cap_epsilon:.4g} at delta={delta:g}"
        )


# ---------------------------------------------------------------- accountant state


@dataclass(frozen=True)
class HistoryEntry:
    noise_multiplier: float
    sample_rate: float
    steps: int


@dataclass
class PrivacyHistory:
    """What an accountant records: runs of steps with the same (noise, sample rate)."""

    entries: list[HistoryEntry] = field(default_factory=list)

    def record(self, *, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        _check_mechanism(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        last = self.entries[-1] if self.entries else None
        if last and last.noise_multiplier == noise_multiplier and last.sample_rate == sample_rate:
            self.entries[-1] = HistoryEntry(noise_multiplier, sample_rate, last.steps + steps)
        else:
            self.entries.append(HistoryEntry(noise_multiplier, sample_rate, steps))

    def extended(self, *, noise_multiplier: float, sample_rate: float, steps: int) -> PrivacyHistory:
        """A copy with one more run of steps: what-if analysis before spending."""
        copy = PrivacyHistory(list(self.entries))
        copy.record(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        return copy

    def __iter__(self) -> Iterator[HistoryEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def total_steps(self) -> int:
        return sum(e.steps for e in self.entries)

    def as_tuples(self) -> list[tuple[float, float, int]]:
        """The ``(noise_multiplier, sample_rate, steps)`` list Opacus accountants use."""
        return [(e.noise_multiplier, e.sample_rate, e.steps) for e in self.entries]

    def to_json(self) -> str:
        return json.dumps(self.as_tuples())

    @classmethod
    def from_json(cls, text: str) -> PrivacyHistory:
        history = cls()
        for noise_multiplier, sample_rate, steps in json.loads(text):
            history.record(
                noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate), steps=int(steps)
            )
        return history


def _check_mechanism(*, noise_multiplier: float, sample_rate: float, steps: int) -> None:
    if not noise_multiplier > 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f"noise_multiplier must be a positive finite number, got {noise_multiplier}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")


# ---------------------------------------------------------------- analysis (pure functions)

REPLACE_ONE = "replace-one"
ADD_REMOVE = "add-remove"
ADJACENCIES = (REPLACE_ONE, ADD_REMOVE)
# The Renyi orders every curve is kept at: Opacus's defaults (1.1 ... 10.9, then 12 ... 63).
ORDERS: tuple[float, ...] = tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS)
# Quadrature: points per noise standard deviation (the trapezoid rule on these smooth, fast
# decaying integrands converges exponentially; 40 per sigma agrees with adaptive quadrature to
# 1e-12 relative, tests/fl_node/test_privacy.py), and tails cut where the mass left is below e^-98.
_POINTS_PER_SIGMA = 40
_TAIL_SIGMAS = 14.0
_MAX_POINTS = 1_000_000
# The PLD accountant's discretization of the privacy loss (pessimistic: an upper bound).
PLD_DISCRETIZATION = 1e-3


def replace_one_rdp(
    noise_multiplier: float, sample_rate: float, orders: tuple[float, ...] = ORDERS
) -> np.ndarray:
    """Renyi DP at ``orders`` of ONE step of the Poisson-sampled Gaussian under replace-one.

    The divergence D_alpha(P || Q) of P = (1-q) N(0, s^2) + q N(1, s^2) from
    Q = (1-q) N(0, s^2) + q N(-1, s^2) (symmetric, so D_alpha(Q || P) is the same): the record
    replaced is sampled with probability q on both sides, and its contribution moves from +1
    to -1. At q = 1 it is the Gaussian's 2 alpha / s^2 (sensitivity 2). For q < 1 there is no
    closed form; the integral of Q (P / Q)^alpha is taken by the trapezoid rule in log space
    on [-1 - 14 s, 2 max(alpha) + 2 + 14 s]: for x < 0 the integrand is below Q, and for
    x > 0 below Q e^(2 alpha x / s^2), a Gaussian centred at 2 alpha, so the cut tails weigh
    less than e^-98.
    """
    _check_mechanism(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=1)
    alphas = np.asarray(orders, dtype=np.float64)
    sigma, q = float(noise_multiplier), float(sample_rate)
    if q >= 1.0:
        return 2.0 * alphas / sigma**2
    low = -1.0 - _TAIL_SIGMAS * sigma
    high = 2.0 * float(alphas.max()) + 2.0 + _TAIL_SIGMAS * sigma
    step = min(sigma, 1.0) / _POINTS_PER_SIGMA
    points = min(int(math.ceil((high - low) / step)) + 1, _MAX_POINTS)
    x, step = np.linspace(low, high, points, retstep=True)
    scale = 1.0 / (2.0 * sigma**2)
    centre = math.log1p(-q) - x * x * scale
    log_p = np.logaddexp(centre, math.log(q) - (x - 1.0) ** 2 * scale)
    log_q = np.logaddexp(centre, math.log(q) - (x + 1.0) ** 2 * scale)
    log_weight = log_q - 0.5 * math.log(2.0 * math.pi * sigma**2) + math.log(step)
    log_ratio = log_p - log_q
    # log of the sum of Q (P/Q)^alpha, minus log of the sum of Q (which is 1 up to the rule's
    # rounding): the difference keeps tiny divergences (small q) from vanishing in that rounding.
    log_mass = _logsumexp(log_weight)
    curve = np.array([(_logsumexp(log_weight + a * log_ratio) - log_mass) / (a - 1.0) for a in alphas])
    return np.maximum(curve, 0.0)


def _logsumexp(values: np.ndarray) -> float:
    top = float(values.max())
    return top + math.log(float(np.exp(values - top).sum()))


def add_remove_rdp(
    noise_multiplier: float, sample_rate: float, orders: tuple[float, ...] = ORDERS
) -> np.ndarray:
    """Renyi DP at ``orders`` of ONE step of the Poisson-sampled Gaussian under add-remove.

    For q < 1, Opacus's analysis of ``(1-q) N(0, s^2) + q N(1, s^2)`` against ``N(0, s^2)``
    (Mironov, Talwar and Zhang 2019): the record is sampled with probability q and moves the
    sum by at most one bound. At q = 1 the release is read as two Gaussians 2 apart, as under
    replace-one (see the module doc), so an unsampled release costs the same in both.
    """
    _check_mechanism(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=1)
    if sample_rate >= 1.0:
        return 2.0 * np.asarray(orders, dtype=np.float64) / float(noise_multiplier) ** 2
    return np.asarray(
        rdp_analysis.compute_rdp(
            q=float(sample_rate), noise_multiplier=float(noise_multiplier), steps=1, orders=list(orders)
        ),
        dtype=np.float64,
    )


def check_adjacency(adjacency: str) -> str:
    if adjacency not in ADJACENCIES:
        raise ValueError(f"unknown adjacency {adjacency!r}; choose one of {ADJACENCIES}")
    return adjacency


@lru_cache(maxsize=1024)
def unit_rdp(noise_multiplier: float, sample_rate: float, adjacency: str = REPLACE_ONE) -> np.ndarray:
    """RDP at :data:`ORDERS` of ONE step of the sampled Gaussian under ``adjacency`` (read-only).

    Cached: budgets are checked on every round of every job, and a step's curve costs a few
    milliseconds of quadrature; ``steps * curve`` is the curve of a run.
    """
    check_adjacency(adjacency)
    step = add_remove_rdp if adjacency == ADD_REMOVE else replace_one_rdp
    curve = step(noise_multiplier, sample_rate)
    curve.setflags(write=False)
    return curve


def history_rdp(history: PrivacyHistory, adjacency: str = REPLACE_ONE) -> np.ndarray | float:
    """The composed RDP curve of ``history`` (RDP adds up per order); 0.0 when it is empty."""
    return sum((e.steps * unit_rdp(e.noise_multiplier, e.sample_rate, adjacency) for e in history), 0.0)


def rdp_to_epsilon(curve: np.ndarray, *, delta: float) -> tuple[float, float]:
    """(epsilon, the order that gives it) of an RDP curve at :data:`ORDERS`.

    A small release (a dataset's count alone) is tightest above the largest order: the figure is
    then an upper bound, a little loose, and Opacus's warning about it is no finding.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        eps, order = rdp_analysis.get_privacy_spent(orders=list(ORDERS), rdp=curve, delta=delta)
    return float(eps), float(order)


def rdp_epsilon(history: PrivacyHistory, *, delta: float, adjacency: str = REPLACE_ONE) -> float:
    """(epsilon, delta)-DP of the composed history via RDP."""
    if not history.entries:
        return 0.0
    return rdp_to_epsilon(np.asarray(history_rdp(history, adjacency)), delta=delta)[0]


def pld_epsilon(
    history: PrivacyHistory,
    *,
    delta: float,
    adjacency: str = REPLACE_ONE,
    discretization: float = PLD_DISCRETIZATION,
) -> float:
    """Epsilon of the history by dp-accounting's PLD accountant under ``adjacency`` (pessimistic).

    Composition commutes, so each distinct mechanism's steps are composed at once.
    """
    if not history.entries:
        return 0.0
    runs: dict[tuple[float, float], int] = {}
    for entry in history:
        key = (entry.noise_multiplier, entry.sample_rate)
        runs[key] = runs.get(key, 0) + entry.steps
    return _pld_epsilon(tuple(sorted(runs.items())), delta, check_adjacency(adjacency), discretization)


@lru_cache(maxsize=256)
def _pld_epsilon(
    runs: tuple[tuple[tuple[float, float], int], ...], delta: float, adjacency: str, discretization: float
) -> float:
    from dp_accounting import dp_event, pld

    accountant = pld.PLDAccountant(
        neighboring_relation(adjacency), value_discretization_interval=discretization
    )
    for (noise_multiplier, sample_rate), steps in runs:
        event = gaussian_event(noise_multiplier, sample_rate, adjacency)
        accountant.compose(dp_event.SelfComposedDpEvent(event, steps))
    return float(accountant.get_epsilon(delta))


def neighboring_relation(adjacency: str):
    """dp-accounting's name for ``adjacency``."""
    from dp_accounting.privacy_accountant import NeighboringRelation

    check_adjacency(adjacency)
    return (
        NeighboringRelation.ADD_OR_REMOVE_ONE if adjacency == ADD_REMOVE else NeighboringRelation.REPLACE_ONE
    )


def gaussian_event(noise_multiplier: float, sample_rate: float, adjacency: str = REPLACE_ONE):
    """dp-accounting's event for one step of a history entry under ``adjacency``.

    Its Gaussian has sensitivity 1 (add/remove) or 2 (replace-one: a point moves from +1 to
    -1). An unsampled entry is two Gaussians 2 bounds apart under both (module doc), so under
    add/remove its event's noise is halved.
    """
    from dp_accounting import dp_event

    if sample_rate >= 1.0:
        return dp_event.GaussianDpEvent(
            noise_multiplier / 2.0 if adjacency == ADD_REMOVE else noise_multiplier
        )
    return dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier))


# Opacus's PRV accountant is add/remove only; the tight figure under either adjacency is the PLD's.
prv_epsilon = pld_epsilon

_ACCOUNTANTS: dict[str, Callable[..., float]] = {"rdp": rdp_epsilon, "pld": pld_epsilon}


def epsilon(
    history: PrivacyHistory, *, delta: float, accountant: str = "rdp", adjacency: str = REPLACE_ONE
) -> float:
    """Epsilon spent by ``history`` at ``delta`` under the named accountant and ``adjacency``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    try:
        analysis = _ACCOUNTANTS[accountant]
    except KeyError:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {sorted(_ACCOUNTANTS)}") from None
    return analysis(history, delta=delta, adjacency=adjacency)


# Calibration's precision on epsilon (the result is always at or below the target).
CALIBRATION_TOLERANCE = 0.005
_MAX_SIGMA = 1e6


@lru_cache(maxsize=256)
def calibrate_noise(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    adjacency: str = REPLACE_ONE,
    prior: tuple[tuple[float, float, int], ...] = (),
) -> float:
    """The smallest noise multiplier (to ``CALIBRATION_TOLERANCE``) whose RDP epsilon under
    ``adjacency`` after ``steps`` steps at ``sample_rate``, composed with the ``prior`` releases
    (``(noise_multiplier, sample_rate, steps)`` each: a dataset's count), stays within the target.

    Cached: every round of a job asks for the same calibration.
    """
    if not target_epsilon > 0 or not math.isfinite(target_epsilon):
        raise ValueError(f"target_epsilon must be a positive number, got {target_epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    _check_mechanism(noise_multiplier=1.0, sample_rate=sample_rate, steps=steps)
    check_adjacency(adjacency)
    step_rdp = add_remove_rdp if adjacency == ADD_REMOVE else replace_one_rdp
    before = history_rdp(PrivacyHistory([HistoryEntry(*release) for release in prior]), adjacency)

    def spent(sigma: float) -> float:  # uncached: the search's sigmas would flush unit_rdp's cache
        return rdp_to_epsilon(before + steps * step_rdp(sigma, sample_rate), delta=delta)[0]

    with warnings.catch_warnings():
        # The search visits very large sigmas whose optimal RDP order is the largest one tried;
        # that bound is loose but only for sigmas the search rejects anyway.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        if prior and rdp_to_epsilon(np.asarray(before), delta=delta)[0] >= target_epsilon:
            raise ValueError(f"the prior releases alone spend more than epsilon {target_epsilon:g}")
        return _bisect_noise(spent, target_epsilon)


def _bisect_noise(spent: Callable[[float], float], target_epsilon: float) -> float:
    low, high = 0.0, 1.0
    eps_high = spent(high)
    while eps_high > target_epsilon:
        low, high = high, 2.0 * high
        if high > _MAX_SIGMA:
            raise ValueError(f"no noise multiplier up to {_MAX_SIGMA:g} reaches epsilon {target_epsilon:g}")
        eps_high = spent(high)
    while target_epsilon - eps_high > CALIBRATION_TOLERANCE and high - low > 1e-9 * high:
        middle = (low + high) / 2.0
        eps_middle = spent(middle)
        if eps_middle <= target_epsilon:
            high, eps_high = middle, eps_middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class PrivacySpent:
    """Privacy of a history snapshot (a job so far) under both accountants, at one adjacency.

    The epsilons are computed on first access: RDP takes milliseconds, PLD a tenth of a
    second or more, which a simulation of many rounds should not pay unasked.
    """

    history: tuple[tuple[float, float, int], ...]
    delta: float
    adjacency: str = REPLACE_ONE

    @classmethod
    def of(cls, history: PrivacyHistory, *, delta: float, adjacency: str = REPLACE_ONE) -> PrivacySpent:
        return cls(history=tuple(history.as_tuples()), delta=delta, adjacency=check_adjacency(adjacency))

    def _history(self) -> PrivacyHistory:
        return PrivacyHistory([HistoryEntry(*entry) for entry in self.history])

    @cached_property
    def epsilon_rdp(self) -> float:
        return rdp_epsilon(self._history(), delta=self.delta, adjacency=self.adjacency)

    @cached_property
    def epsilon_pld(self) -> float:
        return pld_epsilon(self._history(), delta=self.delta, adjacency=self.adjacency)

    @property
    def epsilon_prv(self) -> float:
        """The tight figure's older name (it was Opacus's PRV, which is add/remove only)."""
        return self.epsilon_pld

    @property
    def noise_multiplier(self) -> float:
        return self.history[-1][0] if self.history else 0.0

    @property
    def sample_rate(self) -> float:
        return self.history[-1][1] if self.history else 0.0

    @property
    def steps(self) -> int:
        return sum(entry[2] for entry in self.history)

    def as_dict(self) -> dict[str, float | str]:
        """JSON-ready figures, both accountants and the adjacency included."""
        return {
            "adjacency": self.adjacency,
            "epsilon_rdp": self.epsilon_rdp,
            "epsilon_pld": self.epsilon_pld,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
        }


# ---------------------------------------------------------------- one release's plan

RELEASE_KINDS = ("dp_sgd", "update_gaussian", "score_count", "count")


@dataclass(frozen=True)
class ReleasePlan:
    """One release's mechanism as it is charged, recorded and audited.

    ``noise_multiplier`` is the noise's standard deviation over the release's per-record bound
    ``r`` under replace-one (neighbouring outputs differ by at most ``2 r``; see the module
    doc), so every kind composes in one history: DP-SGD (``r`` = the clip norm C, Poisson rate
    ``sample_rate``, ``steps`` noisy steps), the update-level Gaussian mechanism (a clipped
    update moves by at most 2C: ``r`` = C, rate 1, one step) and the committee's noisy
    correct-counts (a count moves by at most 1: ``r`` = 1/2, so the multiplier is twice the
    count noise's std; rate 1, one step per score released), and the dataset's registered
    count (``fl_node.dp_count``: the same reading, one step). The bounds hold under both
    adjacencies; only a sampled step's curve differs between them.
    """

    kind: str
    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        if self.kind not in RELEASE_KINDS:
            raise ValueError(f"unknown release kind {self.kind!r}; choose one of {RELEASE_KINDS}")
        _check_mechanism(
            noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, steps=self.steps
        )

    def history(self) -> PrivacyHistory:
        history = PrivacyHistory()
        history.record(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, steps=self.steps)
        return history

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "kind": self.kind,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ReleasePlan:
        return cls(
            kind=str(data["kind"]),
            noise_multiplier=float(data["noise_multiplier"]),  # type: ignore[arg-type]
            sample_rate=float(data["sample_rate"]),  # type: ignore[arg-type]
            steps=int(data["steps"]),  # type: ignore[call-overload]
        )


# ---------------------------------------------------------------- per-dataset budget


class BudgetLedger:
    """One dataset's privacy cap and everything spent on it, across rounds and jobs, under the
    dataset's adjacency."""

    def __init__(
        self,
        *,
        epsilon_cap: float,
        delta: float,
        history: PrivacyHistory | None = None,
        adjacency: str = REPLACE_ONE,
    ) -> None:
        if not epsilon_cap > 0 or not math.isfinite(epsilon_cap):
            raise ValueError(f"epsilon_cap must be a positive finite number, got {epsilon_cap}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.epsilon_cap = float(epsilon_cap)
        self.delta = float(delta)
        self.history = history if history is not None else PrivacyHistory()
        self.adjacency = check_adjacency(adjacency)

    def spent(self) -> float:
        return rdp_epsilon(self.history, delta=self.delta, adjacency=self.adjacency)

    def remaining(self) -> float:
        return max(self.epsilon_cap - self.spent(), 0.0)

    def check(self, *, noise_multiplier: float, sample_rate: float, steps: int) -> float:
        """Epsilon after a planned run of steps; PrivacyBudgetExceeded if it passes the cap."""
        planned = self.history.extended(
            noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps
        )
        projected = rdp_epsilon(planned, delta=self.delta, adjacency=self.adjacency)
        if projected > self.epsilon_cap:
            raise PrivacyBudgetExceeded(
                requested_epsilon=projected,
                cap_epsilon=self.epsilon_cap,
                spent_epsilon=self.spent(),
                delta=self.delta,
            )
        return projected

    def record(self, *, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        self.history.record(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)

    def to_json(self) -> str:
        return json.dumps(
            {
                "epsilon_cap": self.epsilon_cap,
                "delta": self.delta,
                "history": self.history.as_tuples(),
                "adjacency": self.adjacency,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BudgetLedger:
        data = json.loads(text)
        history = PrivacyHistory.from_json(json.dumps(data["history"]))
        adjacency = data.get("adjacency", REPLACE_ONE)  # ledgers saved before adjacencies were named
        return cls(epsilon_cap=data["epsilon_cap"], delta=data["delta"], history=history, adjacency=adjacency)


# ---------------------------------------------------------------- update-level Gaussian mechanism

Update = Mapping[str, torch.Tensor]


def global_norm(update: Update) -> float:
    """L2 norm of all floating-point tensors of an update taken as one vector."""
    squares = [t.detach().double().pow(2).sum() for t in update.values() if t.is_floating_point()]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def clip_update(update: Update, *, clip_norm: float) -> dict[str, torch.Tensor]:
    """Scale the update so its global L2 norm is at most ``clip_norm`` (never scales up)."""
    norm = global_norm(update)
    if not math.isfinite(norm):
        raise ValueError("update contains non-finite values; refusing to clip it")
    factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return {k: t * factor if t.is_floating_point() else t.clone() for k, t in update.items()}


def add_gaussian_noise(
    update: Update, *, std: float, randomness: NoiseSource | None = None
) -> dict[str, torch.Tensor]:
    """``update`` plus N(0, std^2) per float entry, drawn from a secret stream by default."""
    source = randomness if randomness is not None else SecureRandom()
    return {
        k: t + source.normal(t.shape, std=std, dtype=t.dtype) if t.is_floating_point() else t
        for k, t in update.items()
    }


class UpdateGaussianMechanism:
    """Clip a whole update to L2 norm ``clip_norm`` and add N(0, (noise_multiplier * clip_norm)^2).

    The guarantee is record-level, like DP-SGD's: datasets that differ in one record. One
    node's clipped update is released on its own, and one record can move it anywhere in
    the C-ball, so neighbouring releases are up to 2C apart: the per-record bound is C and the
    history records ``noise_multiplier`` (std over C), which the replace-one accountant reads
    as two Gaussians 2C apart. Each release is one step; the sample rate
    ``sampling_fraction`` (the chance that this client takes part in a round) buys
    amplification only if participation is random and kept secret, which an on-chain round
    is not: the node passes 1.
    """

    def __init__(self, *, clip_norm: float, noise_multiplier: float, sampling_fraction: float) -> None:
        if not clip_norm > 0 or not math.isfinite(clip_norm):
            raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
        if not noise_multiplier > 0 or not math.isfinite(noise_multiplier):
            raise ValueError(f"noise_multiplier must be a positive finite number, got {noise_multiplier}")
        if not 0 < sampling_fraction <= 1:
            raise ValueError(f"sampling_fraction must be in (0, 1], got {sampling_fraction}")
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.sampling_fraction = float(sampling_fraction)
        self.history = PrivacyHistory()

    @property
    def release(self) -> ReleasePlan:
        """One release as the accountant sees it: std over the per-record bound C (replace-one)."""
        return ReleasePlan("update_gaussian", self.noise_multiplier, self.sampling_fraction, 1)

    def privatize(self, update: Update, *, randomness: NoiseSource | None = None) -> dict[str, torch.Tensor]:
        """Clip, noise (from a secret stream unless one is given) and record one release."""
        skipped = [k for k, t in update.items() if not t.is_floating_point()]
        if skipped:
            warnings.warn(
                f"update tensors {skipped} are not floating point and pass through without noise; "
                "the guarantee covers the floating-point tensors only",
                stacklevel=2,
            )
        clipped = clip_update(update, clip_norm=self.clip_norm)
        noised = add_gaussian_noise(
            clipped, std=self.noise_multiplier * self.clip_norm, randomness=randomness
        )
        release = self.release
        self.history.record(noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate)
        return noised

    def check_participation(self, *, participants: int, expected: int) -> None:
        """Warn when fewer clients took part than were sampled: the noise then covers fewer of them."""
        if participants < expected:
            warnings.warn(
                f"only {participants} of {expected} sampled clients sent an update; the client-level "
                "guarantee assumed the expected number, so the average is noisier than planned",
                stacklevel=2,
            )

    def epsilon(self, *, delta: float, accountant: str = "rdp") -> float:
        return epsilon(self.history, delta=delta, accountant=accountant)
