"""The round driver's privacy: this node's plan for a job, and charging each release before it happens.

The plan (``fl_node.privacy_plan``) is computed from the job's config and this node's own
data: the training release of every round and the noise of the committee's scores. Each
release is reserved in the dataset's budget (``backend.datasets.budget``) BEFORE it is
computed, so a release past the cap is never computed, and its on-chain record
(spendPrivacy) goes out in the background and is awaited before anything is published.
Every computation is a new release with fresh secret randomness: a retrain, after a crash
or after a discarded speculative update, is reserved and charged again.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import replace

from backend.datasets.budget import (
    Charge,
    ReleaseNotReserved,
    mark_released,
    mark_withheld,
    reserve_release,
    send_spend,
    withhold_abandoned,
)
from backend.jobs.config import JobConfig
from backend.jobs.driver import workspace
from backend.jobs.models import RoundAction
from backend.ledger import models as mirror
from fl_node.privacy import ReleasePlan
from fl_node.privacy_plan import PrivacyPlan

logger = logging.getLogger(__name__)
# A spendPrivacy transaction is awaited at most this long before an output would be published.
SPEND_TIMEOUT_S = 300.0


def scores_per_round(job: mirror.Job) -> int:
    """Scores a committee member releases in a round: one per participant not on the committee,
    and one of the base (current global) model, which the contract's margin rule compares with."""
    return max(job.participants.count() - job.committee_size, 1) + 1


def node_plan(job: mirror.Job, config: JobConfig, dataset) -> PrivacyPlan:
    """This node's plan for ``job`` on ``dataset`` (cheap: the calibrations are cached)."""
    train, val = workspace.local_split(dataset, config)
    return config.privacy_plan(
        num_train=len(train),
        num_records=len(train) + len(val),
        scores_per_round=scores_per_round(job),
        public_holdout=dataset.public_holdout,
    )


def reserve(claim: RoundAction, dataset, job_id: int, round_: int, release: ReleasePlan) -> Future | None:
    """Reserve ``release`` (BudgetExceeded: nothing computed, nothing reserved) and send its spend.

    A reservation of the same (job, round, kind) still open belongs to an attempt this node
    lost (a restart, an evicted cache): its output was never published, so it becomes
    withheld (still counted) before the new computation is reserved.

    Returns the spendPrivacy in flight, or None when nothing is owed on chain. The claim keeps
    what is unsent, so the end of a job can show that every spend reached the chain.
    """
    withhold_abandoned(dataset, job_id, round_, release.kind)
    charge = reserve_release(dataset, job_id, round_, release)
    # A DP job's contract refuses an update without the round's spend: a release whose increase
    # rounds to nothing is still recorded as the smallest amount.
    owed = max(charge.micro_epsilon, 1) if charge.onchain_id else 0
    charge = replace(charge, micro_epsilon=owed)
    RoundAction.objects.filter(pk=claim.pk).update(budget_charged=True, privacy_unsent=owed)
    return send_spend(charge) if owed else None


def await_spend(claim: RoundAction, spending: Future | None) -> None:
    """Nothing computed on the data leaves this node before the chain recorded its cost."""
    if spending is None:
        return
    spending.result(timeout=SPEND_TIMEOUT_S)
    RoundAction.objects.filter(pk=claim.pk).update(privacy_unsent=0)


def released(dataset, job_id: int, round_: int, kind: str) -> None:
    _settle(mark_released, dataset, job_id, round_, kind)


def withheld(dataset, job_id: int, round_: int, kind: str) -> None:
    _settle(mark_withheld, dataset, job_id, round_, kind)


def _settle(mark, dataset, job_id: int, round_: int, kind: str) -> None:
    if kind == "none":  # a job without DP reserves nothing
        return
    try:
        mark(dataset, job_id, round_, kind)
    except ReleaseNotReserved:  # a retried action already settled it
        logger.debug("release %s of job %s round %s was already settled", kind, job_id, round_)


__all__ = ["Charge", "await_spend", "node_plan", "released", "reserve", "scores_per_round", "withheld"]
