"""A job's privacy plan: what each participant releases in a round and the noise each release
carries, computed from the job and public numbers only (``participant_plan``: the dataset's
size and public hold-out flag, both on chain), so every member computes every participant's.

One count of the releases for everyone: a committee member scores every update of the round and
the unchanged global model (the base, which the contract's margin rule compares with), so its
plan covers ``scores_per_round`` = the trainers plus one. The node (backend/jobs/driver/privacy.py)
and the simulator (fl_node.simulate) both plan with it, and spend no more.
"""

from __future__ import annotations

import math

from fl_node.dp_count import count_release
from fl_node.job.config import JobConfig
from fl_node.job.limits import MAX_SPEND_PER_ROUND_MICRO, MICRO_EPSILON
from fl_node.privacy import ADD_REMOVE, UpdateGaussianMechanism
from fl_node.privacy_plan import PrivacyPlan, plan_privacy, public_train_size

# One release may charge at most this many times the job's whole target epsilon (see below).
SPEND_BOUND_FACTOR = 2


def scores_per_round(participants: int, committee_size: int) -> int:
    """Scores a committee member releases in a round: one per participant not on the committee
    (at least one), and one of the base (current global) model."""
    return max(participants - committee_size, 1) + 1


def participant_plan(
    job: JobConfig, *, samples: int, public_holdout: bool, scores_per_round: int
) -> PrivacyPlan:
    """The plan of a participant whose dataset has ``samples`` records (as on chain).

    The training part's size is the planned one for the held-out fraction (the public hold-out's
    when declared, else the job's validation share), never the secret split's count.
    """
    return privacy_plan(
        job,
        num_train=update_samples(job, samples=samples, public_holdout=public_holdout),
        num_records=samples,
        scores_per_round=scores_per_round,
        public_holdout=public_holdout,
    )


def update_samples(job: JobConfig, *, samples: int, public_holdout: bool) -> int:
    """The sample count a participant's update names on chain (its aggregation weight): the
    planned training part of its registered ``samples``, a function of public values only.

    Never the secret split's count. That count's distribution does not depend on the records
    (each record's side is a keyed coin: the coupling of docs/PRIVACY.md), but only through an
    argument over the node's key; a public count needs none, and any member recomputes it.
    """
    return public_train_size(samples, public_holdout=public_holdout, val_fraction=job.val_fraction)


def validation_records(job: JobConfig, *, samples: int, public_holdout: bool) -> int:
    """The record count a participant's noisy scores are normalized by: the planned held-out part
    of its registered ``samples`` (public), for the reason :func:`update_samples` gives."""
    return max(1, samples - update_samples(job, samples=samples, public_holdout=public_holdout))


def privacy_plan(
    job: JobConfig, *, num_train: int, num_records: int, scores_per_round: int, public_holdout: bool = False
) -> PrivacyPlan:
    """A plan for the job from a training part of ``num_train`` records out of ``num_records``.

    ``scores_per_round``: the score releases of a committee member a round (``scores_per_round()``;
    0 where nothing is scored); ``public_holdout``: the dataset declared its hold-out split
    public, so its scores are exact and free.
    """
    return plan_privacy(
        mode=job.dp.mode,
        target_epsilon=job.dp.target_epsilon,
        delta=job.dp.delta,
        rounds=job.rounds,
        num_train=num_train,
        num_records=num_records,
        batch_size=job.batch_size,
        epochs=job.local_epochs,
        clip_norm=job.dp.max_grad_norm,
        scores_per_round=scores_per_round,
        public_holdout=public_holdout,
        # Adaptive work: noise calibrated for the most steps a round may run; each round is
        # charged for the steps it ran (fl_node.privacy_plan.train_release).
        max_local_steps=job.max_local_steps if job.adaptive_work else None,
        adjacency=job.dp.adjacency,
        # Under add-remove every participant's registered size is a DP count (fl_node.dp_count).
        count=count_release() if job.dp.adjacency == ADD_REMOVE else None,
    )


def update_mechanism(plan: PrivacyPlan) -> UpdateGaussianMechanism | None:
    """dp.mode "update": clip each whole update to C and add noise of the plan's std (2C sensitivity)."""
    if plan.train is None or plan.train.kind != "update_gaussian":
        return None
    return UpdateGaussianMechanism(
        clip_norm=plan.clip_norm,
        noise_multiplier=plan.update_noise_std / plan.clip_norm,
        sampling_fraction=1.0,
    )


def planned_spend_bound(job: JobConfig) -> int:
    """The job's on-chain ``maxSpendPerRound`` (micro-epsilon) computed from its configuration.

    0 for a job without DP (the chain then accepts no spend and needs none before an update).
    Otherwise twice the job's target epsilon, capped at the contract's limit: an honest release
    charges a dataset at most what the whole job was planned to spend (a round's increase of the
    dataset's composed RDP epsilon is below the job's total at the job's delta); the factor leaves
    room for a dataset whose own delta is smaller than the job's. Anything above it is no release
    this job planned, and the chain refuses it.
    """
    dp = job.dp
    if not dp.private or not dp.target_epsilon:
        return 0
    bound = math.ceil(SPEND_BOUND_FACTOR * float(dp.target_epsilon) * MICRO_EPSILON)
    # FederatedLearning.MAX_SPEND_PER_ROUND (= DataRegistry.MAX_PRIVACY_CAP): epsilon 100.
    return max(1, min(bound, MAX_SPEND_PER_ROUND_MICRO))
