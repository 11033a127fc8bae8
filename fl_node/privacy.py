"""Differential-privacy accounting, per-dataset budgets and the update-level Gaussian mechanism.

State and formulas are kept apart, as in Opacus's accountants:

* ``PrivacyHistory`` only records ``(noise_multiplier, sample_rate, steps)`` of
  the subsampled Gaussian mechanism (Abadi et al. 2016, "Deep Learning with
  Differential Privacy"). It is JSON-serialisable so a node can persist it per
  dataset.
* ``epsilon(history, delta=..., accountant=...)`` is a pure function. ``"rdp"``
  is Renyi DP of the sampled Gaussian mechanism (Mironov 2017; Mironov, Talwar
  and Zhang 2019) converted to (epsilon, delta); ``"prv"`` numerically composes
  privacy loss random variables (Gopi, Lee and Wutschitz 2021), which is tighter.
  RDP is the conservative one, so budgets are enforced with RDP and PRV is reported.
* ``BudgetLedger`` holds one dataset's cap and history. Spending composes the
  whole recorded history with the RDP accountant instead of summing per-job
  epsilons: composition in RDP is additive per order, so the total is valid for
  any sequence of rounds and jobs and far tighter than adding (epsilon, delta)
  pairs (basic composition).
* ``UpdateGaussianMechanism`` clips a whole model update and adds Gaussian noise
  (in the style of DP-FedAvg, McMahan et al. 2018, "Learning Differentially Private
  Recurrent Language Models"), accounted at the record level with sensitivity 2C.
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
from opacus.accountants.prv import PRVAccountant
from opacus.accountants.rdp import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

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


@lru_cache(maxsize=1024)
def unit_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """RDP at Opacus's default orders of ONE step of the sampled Gaussian mechanism (read-only).

    Opacus's ``compute_rdp`` costs ~0.1 s per (noise, rate) on a small CPU and returns
    ``steps * (one-step curve)``, so caching the one-step curve gives the same floats in
    microseconds: budgets are checked on every round of every job.
    """
    curve = rdp_analysis.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS
    )
    curve.setflags(write=False)
    return curve


def history_rdp(history: PrivacyHistory) -> np.ndarray | float:
    """The composed RDP curve of ``history`` (RDP adds up per order); 0.0 when it is empty."""
    return sum((e.steps * unit_rdp(e.noise_multiplier, e.sample_rate) for e in history), 0.0)


def rdp_epsilon(history: PrivacyHistory, *, delta: float) -> float:
    """(epsilon, delta)-DP of the composed history via RDP at Opacus's default orders."""
    if not history.entries:
        return 0.0
    eps, _ = rdp_analysis.get_privacy_spent(
        orders=RDPAccountant.DEFAULT_ALPHAS, rdp=history_rdp(history), delta=delta
    )
    return float(eps)


def prv_epsilon(history: PrivacyHistory, *, delta: float) -> float:
    """Upper bound on epsilon from the PRV accountant (numerical composition)."""
    if not history.entries:
        return 0.0
    accountant = PRVAccountant()
    accountant.history = history.as_tuples()
    return float(accountant.get_epsilon(delta=delta))


_ACCOUNTANTS: dict[str, Callable[..., float]] = {"rdp": rdp_epsilon, "prv": prv_epsilon}


def epsilon(history: PrivacyHistory, *, delta: float, accountant: str = "rdp") -> float:
    """Epsilon spent by ``history`` at ``delta`` under the named accountant."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    try:
        analysis = _ACCOUNTANTS[accountant]
    except KeyError:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {sorted(_ACCOUNTANTS)}") from None
    return analysis(history, delta=delta)


@lru_cache(maxsize=256)
def calibrate_noise(*, target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier whose RDP epsilon after ``steps`` stays within the target.

    Cached: every round of a job asks for the same calibration.
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be positive, got {target_epsilon}")
    _check_mechanism(noise_multiplier=1.0, sample_rate=sample_rate, steps=steps)
    with warnings.catch_warnings():
        # The bisection visits very large sigmas whose optimal RDP order is the largest one
        # tried; that bound is loose but only for sigmas the search rejects anyway.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant="rdp",
                epsilon_tolerance=0.005,
            )
        )


@dataclass(frozen=True)
class PrivacySpent:
    """Privacy of a history snapshot (a job so far) under both accountants.

    The epsilons are computed on first access: RDP takes milliseconds, PRV up
    to a second or two, which a simulation of many rounds should not pay unasked.
    """

    history: tuple[tuple[float, float, int], ...]
    delta: float

    @classmethod
    def of(cls, history: PrivacyHistory, *, delta: float) -> PrivacySpent:
        return cls(history=tuple(history.as_tuples()), delta=delta)

    def _history(self) -> PrivacyHistory:
        return PrivacyHistory([HistoryEntry(*entry) for entry in self.history])

    @cached_property
    def epsilon_rdp(self) -> float:
        return rdp_epsilon(self._history(), delta=self.delta)

    @cached_property
    def epsilon_prv(self) -> float:
        return prv_epsilon(self._history(), delta=self.delta)

    @property
    def noise_multiplier(self) -> float:
        return self.history[-1][0] if self.history else 0.0

    @property
    def sample_rate(self) -> float:
        return self.history[-1][1] if self.history else 0.0

    @property
    def steps(self) -> int:
        return sum(entry[2] for entry in self.history)

    def as_dict(self) -> dict[str, float]:
        """JSON-ready figures, both accountants included."""
        return {
            "epsilon_rdp": self.epsilon_rdp,
            "epsilon_prv": self.epsilon_prv,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
        }


# ---------------------------------------------------------------- one release's plan

RELEASE_KINDS = ("dp_sgd", "update_gaussian", "score_count")


@dataclass(frozen=True)
class ReleasePlan:
    """One release's mechanism as it is charged, recorded and audited.

    ``noise_multiplier`` is the noise's standard deviation divided by the release's L2
    sensitivity under the record-level adjacency the accounting uses, so every kind composes
    in one RDP history: DP-SGD (Poisson rate ``sample_rate``, ``steps`` noisy steps), the
    update-level Gaussian mechanism (sensitivity 2C for one record, rate 1, one step) and
    the committee's noisy correct-counts (sensitivity 1 per score, rate 1, one step per
    score released).
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
    """One dataset's privacy cap and everything spent on it, across rounds and jobs."""

    def __init__(self, *, epsilon_cap: float, delta: float, history: PrivacyHistory | None = None) -> None:
        if not epsilon_cap > 0 or not math.isfinite(epsilon_cap):
            raise ValueError(f"epsilon_cap must be a positive finite number, got {epsilon_cap}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.epsilon_cap = float(epsilon_cap)
        self.delta = float(delta)
        self.history = history if history is not None else PrivacyHistory()

    def spent(self) -> float:
        return rdp_epsilon(self.history, delta=self.delta)

    def remaining(self) -> float:
        return max(self.epsilon_cap - self.spent(), 0.0)

    def check(self, *, noise_multiplier: float, sample_rate: float, steps: int) -> float:
        """Epsilon after a planned run of steps; PrivacyBudgetExceeded if it passes the cap."""
        planned = self.history.extended(
            noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps
        )
        projected = rdp_epsilon(planned, delta=self.delta)
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
            {"epsilon_cap": self.epsilon_cap, "delta": self.delta, "history": self.history.as_tuples()}
        )

    @classmethod
    def from_json(cls, text: str) -> BudgetLedger:
        data = json.loads(text)
        history = PrivacyHistory.from_json(json.dumps(data["history"]))
        return cls(epsilon_cap=data["epsilon_cap"], delta=data["delta"], history=history)


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


# One record can move a clipped update from any point of the C-ball to any other.
RECORD_SENSITIVITY_FACTOR = 2.0


class UpdateGaussianMechanism:
    """Clip a whole update to L2 norm ``clip_norm`` and add N(0, (noise_multiplier * clip_norm)^2).

    The guarantee is record-level, like DP-SGD's: datasets that differ in one record. One
    node's clipped update is released on its own, and one record can move it anywhere in
    the C-ball, so the release's sensitivity is 2C and the history records
    ``noise_multiplier / 2`` (std over sensitivity). Each release is one step; the sample rate
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
        """One release as the accountant sees it: std over the record-level sensitivity 2C."""
        return ReleasePlan(
            "update_gaussian",
            self.noise_multiplier / RECORD_SENSITIVITY_FACTOR,
            self.sampling_fraction,
            1,
        )

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
