"""One participant's privacy in one job, planned once: what each round may release, at what noise.

Every release that depends on a dataset is charged to it in one RDP history
(``fl_node.privacy``), under the job's adjacency (``dp.adjacency``): **add-remove** for a job
created now (every dataset that joins registered a DP count of its records,
``fl_node.dp_count``, and that count is part of every participant's plan: the calibration
composes it with the job's releases, and a participant's job figure includes it), or
**replace-one** for a job configured before adjacencies were named (its datasets' sizes were
published exactly). A round of a job releases, per participant, either

* a **training update**: DP-SGD (Poisson rate q, ``steps`` noisy steps, per-example clip C:
  a record moves a step's noisy sum by up to C when sampled, 2C when replaced), or the
  **update-level Gaussian mechanism** (the whole local update clipped to C and noised once:
  one record can move it anywhere in the C-ball, 2C);
* or, for a committee member, **scores**: one noisy correct-count per update it scores
  (one record changes a count by at most 1; std = the score noise).

A member is on the committee or trains in a round, never both, so a job's spend is at most
``rounds`` times the larger of the two per-round curves. The plan picks the score noise so
that a round of scores costs no more than a round of training at the RDP order that
decides the job's epsilon (see ``dominating_score_noise``); the job's training noise is
calibrated for ``rounds`` training rounds, and the job stays within its target whatever
committees the chain draws (the per-round bound at that order holds whichever release the
round makes, which is what a Renyi filter needs: Feldman and Zrnic 2021). A dataset that
declares its hold-out split public (on chain, at registration) is scored without noise and
without a charge.

The plan is a function of public values only: the job's config, the dataset's registered size
n (on chain: its DP count under add-remove), whether its hold-out is public (on chain) and the
number of scores a committee member releases. The training part's size is the planned one (:func:`planned_train_size`), not the
count the node's secret split happens to give, so any member can recompute every
participant's plan, and from its recorded spends its epsilon (:func:`job_epsilon`).

delta must be small against the dataset: with n records, any delta above 1/n allows a
mechanism that publishes a random record in the clear, so the plan requires delta <= 1/(10 n).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fl_node.privacy import (
    ADD_REMOVE,
    ORDERS,
    REPLACE_ONE,
    PrivacyHistory,
    ReleasePlan,
    calibrate_noise,
    check_adjacency,
    history_rdp,
    rdp_epsilon,
    rdp_to_epsilon,
    unit_rdp,
)

MODES = ("none", "sgd", "update")
# How many times smaller than 1/n delta must be.
DELTA_FACTOR = 10


def max_delta(num_records: int) -> float:
    """The largest delta the plan accepts for a dataset of ``num_records`` records."""
    if num_records < 1:
        raise ValueError("a dataset needs at least one record")
    return 1.0 / (DELTA_FACTOR * num_records)


def check_delta(delta: float, num_records: int) -> None:
    """ValueError unless 0 < delta <= 1 / (10 n)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    limit = max_delta(num_records)
    if delta > limit:
        raise ValueError(
            f"delta {delta:g} is too large for {num_records} records: it must be at most "
            f"1/(10 n) = {limit:.3g}, or a mechanism could publish a record in the clear"
        )


@dataclass(frozen=True)
class PrivacyPlan:
    """What one participant releases per round of one job, and at what noise.

    ``train`` is one training round's release (None without DP); ``score_noise_multiplier``
    is the std of each score's count noise (sensitivity 1), None when scores are not noised
    (a job without DP, or a public hold-out). ``count`` is the dataset's registered DP count
    (add-remove plans only): calibrated against and composed into the job's figure.
    """

    mode: str
    target_epsilon: float | None
    delta: float
    rounds: int
    clip_norm: float
    train: ReleasePlan | None
    score_noise_multiplier: float | None
    scores_per_round: int
    public_holdout: bool
    adjacency: str = REPLACE_ONE
    count: ReleasePlan | None = None

    @property
    def private(self) -> bool:
        return self.train is not None

    @property
    def sgd_noise_multiplier(self) -> float | None:
        """The DP-SGD noise multiplier (std / C per step), None in other modes."""
        return self.train.noise_multiplier if self.train and self.train.kind == "dp_sgd" else None

    @property
    def update_noise_std(self) -> float:
        """The update mechanism's noise std: the plan's multiplier times the per-record bound C
        (neighbouring clipped updates are up to 2C apart; the replace-one accountant knows it)."""
        if self.train is None or self.train.kind != "update_gaussian":
            raise ValueError("this plan has no update-level mechanism")
        return self.train.noise_multiplier * self.clip_norm

    def score_release(self, scores: int) -> ReleasePlan | None:
        """The release of ``scores`` noisy counts, or None when scores are not charged.

        A count moves by at most 1 when one record is replaced: a per-record bound of 1/2, so
        the recorded multiplier is the count noise's std over 1/2.
        """
        if self.score_noise_multiplier is None or scores < 1:
            return None
        return ReleasePlan("score_count", 2.0 * self.score_noise_multiplier, 1.0, scores)

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "rounds": self.rounds,
            "clip_norm": self.clip_norm,
            "train": self.train.as_dict() if self.train else None,
            "score_noise_multiplier": self.score_noise_multiplier,
            "scores_per_round": self.scores_per_round,
            "public_holdout": self.public_holdout,
            "adjacency": self.adjacency,
            "count": self.count.as_dict() if self.count else None,
        }


# The share of a dataset that declared its hold-out public that is that hold-out: one fixed set
# of records for every job, never trained on (``backend.datasets.commitment.public_holdout``).
PUBLIC_HOLDOUT_FRACTION = 0.2


def held_out_fraction(*, public_holdout: bool, val_fraction: float) -> float:
    """The share of a dataset's records a job does not train on: its public hold-out when it
    declared one, else the job's validation share."""
    return PUBLIC_HOLDOUT_FRACTION if public_holdout else val_fraction


def public_train_size(num_records: int, *, public_holdout: bool, val_fraction: float) -> int:
    """The training part's size every member assumes for a participant (see
    :func:`planned_train_size`): from its dataset's size and hold-out flag, both on chain."""
    return planned_train_size(
        num_records, held_out_fraction(public_holdout=public_holdout, val_fraction=val_fraction)
    )


def planned_train_size(num_records: int, holdout_fraction: float) -> int:
    """The training part's size a plan assumes for ``num_records`` records with ``holdout_fraction``
    of them held out (validation or a public hold-out): public, whatever the secret split gives.

    The node's split puts each record on a side by a keyed hash of that record alone
    (``fl_node.data.keyed_split``), so the real part's size varies around this; DP-SGD samples
    the real part at the plan's rate, and the accounting needs only that rate.
    """
    if num_records < 1:
        raise ValueError("a dataset needs at least one record")
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"the held-out fraction must be in [0, 1), got {holdout_fraction}")
    return max(1, round(num_records * (1.0 - holdout_fraction)))


def steps_per_round(num_train: int, *, batch_size: int, epochs: int, local_steps: int | None) -> int:
    if num_train < 1:
        raise ValueError("cannot train on an empty dataset")
    return local_steps or epochs * math.ceil(num_train / batch_size)


def plan_privacy(
    *,
    mode: str,
    target_epsilon: float | None,
    delta: float,
    rounds: int,
    num_train: int,
    num_records: int,
    batch_size: int,
    epochs: int = 1,
    local_steps: int | None = None,
    clip_norm: float = 1.0,
    scores_per_round: int = 1,
    public_holdout: bool = False,
    max_local_steps: int | None = None,
    adjacency: str = REPLACE_ONE,
    count: ReleasePlan | None = None,
) -> PrivacyPlan:
    """The plan of one participant with ``num_records`` records (``num_train`` of them trained on).

    ``adjacency``: the job's. Under add-remove ``count`` (the dataset's registered count's
    release, ``fl_node.dp_count.count_release``) is required: the noise is calibrated so that
    the count and every round of the job together stay within the target.

    ``max_local_steps`` (DP-SGD only) is the most steps a round may run when the work per round
    varies (``fl_node.scheduler.AimdController``): the noise is calibrated for ``rounds x
    max_local_steps`` so any chosen work stays within the target, and each round is charged for
    the steps it actually ran (:func:`train_release`). None keeps the fixed work per round.
    """
    if mode not in MODES:
        raise ValueError(f"unknown DP mode {mode!r}; choose one of {MODES}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if scores_per_round < 0:
        raise ValueError("scores_per_round must not be negative")
    if not clip_norm > 0 or not math.isfinite(clip_norm):
        raise ValueError(f"the clip norm must be a positive number, got {clip_norm}")
    check_adjacency(adjacency)
    if (adjacency == ADD_REMOVE) != (count is not None):
        raise ValueError("an add-remove plan needs the dataset's count release, and only it takes one")
    if mode == "none":
        return PrivacyPlan(
            mode,
            None,
            delta,
            rounds,
            clip_norm,
            None,
            None,
            scores_per_round,
            public_holdout,
            adjacency,
            count,
        )
    if target_epsilon is None or not target_epsilon > 0 or not math.isfinite(target_epsilon):
        raise ValueError(f"a private job needs a positive target epsilon, got {target_epsilon}")
    check_delta(delta, num_records)
    if mode == "sgd":
        steps = steps_per_round(num_train, batch_size=batch_size, epochs=epochs, local_steps=local_steps)
        if max_local_steps is not None:
            if not isinstance(max_local_steps, int) or max_local_steps < 1:
                raise ValueError(f"max_local_steps must be a positive integer, got {max_local_steps!r}")
            steps = max_local_steps
    prior = () if count is None else tuple(count.history().as_tuples())
    if mode == "sgd":
        rate = min(batch_size / num_train, 1.0)
        sigma = calibrate_noise(
            target_epsilon=target_epsilon,
            delta=delta,
            sample_rate=rate,
            steps=rounds * steps,
            adjacency=adjacency,
            prior=prior,
        )
        train = ReleasePlan("dp_sgd", sigma, rate, steps)
    else:
        # One release per round, no amplification (participation is public on chain).
        sigma = calibrate_noise(
            target_epsilon=target_epsilon,
            delta=delta,
            sample_rate=1.0,
            steps=rounds,
            adjacency=adjacency,
            prior=prior,
        )
        train = ReleasePlan("update_gaussian", sigma, 1.0, 1)
    score_noise = (
        None
        if public_holdout or scores_per_round == 0
        else dominating_score_noise(
            train, scores_per_round, rounds=rounds, delta=delta, adjacency=adjacency, count=count
        )
    )
    return PrivacyPlan(
        mode,
        float(target_epsilon),
        delta,
        rounds,
        clip_norm,
        train,
        score_noise,
        scores_per_round,
        public_holdout,
        adjacency,
        count,
    )


def dominating_score_noise(
    train: ReleasePlan,
    scores: int,
    *,
    rounds: int,
    delta: float,
    adjacency: str = REPLACE_ONE,
    count: ReleasePlan | None = None,
) -> float:
    """The smallest count-noise std whose ``scores`` releases never raise the job's epsilon.

    The job's bound is epsilon(rounds x T) where T is a training round's RDP curve; the
    conversion to (epsilon, delta) takes its minimum over the orders, reached at alpha*. A
    noisy count with std s costs alpha / (2 s^2) at order alpha (replacing one record moves
    it by at most 1). If a round of ``scores`` counts costs at most T at alpha*, every mix of
    training and scoring rounds has an RDP curve at most rounds x T at alpha*, hence an
    epsilon at most the one at alpha*, which is the job's target:
    s^2 = scores * alpha* / (2 T(alpha*)). With a registered count C, the bound is
    epsilon(C + rounds x T) and alpha* its order; the argument is the same.
    """
    if scores < 1:
        raise ValueError("scores must be at least 1")
    train_curve = train.steps * unit_rdp(train.noise_multiplier, train.sample_rate, adjacency)
    before = 0.0 if count is None else history_rdp(count.history(), adjacency)
    _, best_order = rdp_to_epsilon(before + rounds * train_curve, delta=delta)
    index = list(ORDERS).index(best_order)
    std = math.sqrt(scores * best_order / (2.0 * train_curve[index])) * (1 + 1e-9)
    # The float rounding of the bound must not flip it (the recorded multiplier is 2 std).
    assert scores * unit_rdp(2.0 * std, 1.0)[index] <= train_curve[index]
    return std


def train_release(plan: PrivacyPlan, steps: int) -> ReleasePlan | None:
    """The charge of one training round that ran ``steps`` DP-SGD steps (variable work).

    The plan's noise and rate with ``steps`` steps: more local work is charged more. Refuses
    more steps than the plan was calibrated for (its ``train.steps``), which would break the
    job's target. None for a plan without DP; the update mechanism's charge does not depend on
    the steps (one release per round).
    """
    if plan.train is None:
        return None
    if plan.train.kind != "dp_sgd":
        return plan.train
    if not isinstance(steps, int) or not 1 <= steps <= plan.train.steps:
        raise ValueError(f"steps must be an integer in [1, {plan.train.steps}] for this plan, got {steps!r}")
    return ReleasePlan("dp_sgd", plan.train.noise_multiplier, plan.train.sample_rate, steps)


# What an on-chain spend records (FederatedLearning.spendPrivacy's ``kind``).
SPEND_UPDATE = 0  # a published training update (travels with submitUpdate)
SPEND_SCORES = 1  # a committee member's scores of one round
SPEND_WITHHELD = 2  # a training release computed and never published (still a release)
SPEND_KINDS = (SPEND_UPDATE, SPEND_SCORES, SPEND_WITHHELD)


def spend_release(plan: PrivacyPlan, kind: int, steps: int) -> ReleasePlan | None:
    """The release one recorded spend stands for under ``plan``; None when it costs nothing.

    A training release (kind 0 or 2) of a DP-SGD plan is charged for the ``steps`` recorded
    (0, a record that names none, counts as the plan's most); the update mechanism's is one
    release whatever its steps. A score release (kind 1) is the plan's ``scores_per_round``
    noisy counts; a plan that charges no scores (a public hold-out) costs nothing for it.
    More steps than the plan allows are charged as recorded: a figure follows what was done.
    """
    if kind not in SPEND_KINDS:
        raise ValueError(f"unknown spend kind {kind!r}; expected one of {SPEND_KINDS}")
    if plan.train is None:
        return None
    if kind == SPEND_SCORES:
        return plan.score_release(plan.scores_per_round)
    if plan.train.kind != "dp_sgd":
        return plan.train
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    return ReleasePlan(
        "dp_sgd", plan.train.noise_multiplier, plan.train.sample_rate, steps or plan.train.steps
    )


def spends_history(plan: PrivacyPlan, spends: Iterable[tuple[int, int]]) -> PrivacyHistory:
    """The history of a participant's recorded spends, each ``(kind, steps)``, under ``plan``."""
    history = PrivacyHistory()
    for kind, steps in spends:
        release = spend_release(plan, kind, steps)
        if release is not None:
            history.record(
                noise_multiplier=release.noise_multiplier,
                sample_rate=release.sample_rate,
                steps=release.steps,
            )
    return history


def job_epsilon(plan: PrivacyPlan, spends: Iterable[tuple[int, int]]) -> float:
    """A participant's own epsilon in one job, at the job's delta and adjacency, from its
    recorded spends.

    Anyone can compute it: the plan follows from public values (the job's config, the
    dataset's registered size on chain, its public hold-out flag, the committee's score count),
    and the spends (kind, steps) are on chain. It is the job's releases composed on their own
    (with the dataset's count under add-remove, which that adjacency rests on), not the rise of
    the dataset's whole budget (which other jobs share).
    """
    if plan.train is None:
        return 0.0
    history = spends_history(plan, spends)
    if plan.count is not None:
        history = PrivacyHistory(plan.count.history().entries + history.entries)
    return rdp_epsilon(history, delta=plan.delta, adjacency=plan.adjacency)
