"""The round driver's privacy: this node's plan for a job, and charging each release before it happens.

The plan (``fl_node.privacy_plan``) is computed from the job's config and public facts of this
node's dataset (its size, its public hold-out flag): the training release of every round and
the noise of the committee's scores, as every other member computes it. Each
release is reserved in the dataset's budget (``backend.datasets.budget``) BEFORE it is
computed, so a release past the cap is never computed. A training release's on-chain record
goes in the update's own submitUpdate (``reserve_for_update``); a score release's
(spendPrivacy) goes out in the background and is awaited before the scores are published.
Every computation is a new release with fresh secret randomness: a retrain, after a crash
or after a discarded speculative update, is reserved and charged again.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import replace
from datetime import datetime

from backend.datasets import chain
from backend.datasets.budget import (
    Charge,
    ReleaseNotReserved,
    mark_released,
    mark_withheld,
    reserve_release,
    send_spend,
    withhold_abandoned,
)
from backend.datasets.models import PrivacyRelease
from backend.jobs.context import NodeContext
from backend.jobs.models import RoundAction
from backend.ledger import models as mirror
from backend.ledger.errors import LedgerError
from backend.ledger.resources import SpendKind
from fl_node.job import plan as job_plan
from fl_node.job.config import JobConfig
from fl_node.privacy import ReleasePlan
from fl_node.privacy_plan import PrivacyPlan

logger = logging.getLogger(__name__)
# A spendPrivacy transaction is awaited at most this long before an output would be published.
SPEND_TIMEOUT_S = 300.0
# The chain records at most this many spends per participant and round (FederatedLearning).
MAX_SPENDS_PER_ROUND = 3


def scores_per_round(job: mirror.Job) -> int:
    """Scores a committee member releases in a round (``fl_node.job.plan.scores_per_round``)."""
    return job_plan.scores_per_round(job.participants.count(), job.committee_size)


def node_plan(ctx: NodeContext, job: mirror.Job, config: JobConfig, dataset) -> PrivacyPlan:
    """This node's plan for ``job`` on ``dataset``: from public values only (the dataset's size,
    its public hold-out flag, the job), exactly as any other member computes it. Cheap: the
    calibrations are cached, and no data is read."""
    return job_plan.participant_plan(
        config,
        samples=dataset.num_samples,
        public_holdout=dataset.public_holdout,
        scores_per_round=scores_per_round(job),
    )


def score_records(config: JobConfig, dataset) -> int:
    """The public record count this node's noisy scores are normalized by (its planned
    validation part), not the size of its secret split (``fl_node.job.plan.validation_records``)."""
    return job_plan.validation_records(
        config, samples=dataset.num_samples, public_holdout=dataset.public_holdout
    )


def reserve(claim: RoundAction, dataset, job_id: int, round_: int, release: ReleasePlan) -> Future | None:
    """Reserve ``release`` (BudgetExceeded: nothing computed, nothing reserved) and send its spend.

    A reservation of the same (job, round, kind) still open belongs to an attempt this node
    lost (a restart, an evicted cache): its output was never published, so it becomes
    withheld (still counted) before the new computation is reserved.

    Returns the spendPrivacy in flight, or None when nothing is owed on chain. The claim keeps
    what is unsent, so the end of a job can show that every spend reached the chain.
    """
    charge = _reserve_locally(claim, dataset, job_id, round_, release)
    return send_spend(charge) if charge.micro_epsilon else None


def reserve_for_update(claim: RoundAction, dataset, job_id: int, round_: int, release: ReleasePlan) -> int:
    """Reserve a training release whose spend goes on chain WITH the update (submitUpdate's
    ``spend``), in one transaction: nothing is sent now. Returns the micro-epsilon owed (0: none).

    Reserved before anything is computed, as ``reserve``; the sealed update cannot be read before
    its submit carried the spend (its key is released only for an update on chain).
    """
    return _reserve_locally(claim, dataset, job_id, round_, release).micro_epsilon


def reuse_for_update(
    claim: RoundAction, dataset, job_id: int, round_: int, release: ReleasePlan, *, since: datetime
) -> int | None:
    """The micro-epsilon owed by an open reservation of exactly ``release`` (kind, noise, rate,
    steps) in this round, made at ``since`` or later, now this claim's; None when there is none.

    Only for a retry whose caller KNOWS what happened under that reservation (the same process
    made it, then failed, e.g. its database went away): either nothing was computed yet, or the
    caller holds the computed output, unpublished, and publishes it now. Either way the release
    it stands for happens once, charged once. A reservation left by an attempt of unknown fate
    is withheld instead (``reserve``).
    """
    reserved = (
        PrivacyRelease.objects.filter(
            dataset_id=dataset.pk,
            job=str(job_id),
            round=round_,
            kind=release.kind,
            status=PrivacyRelease.Status.RESERVED,
            created__gte=since,
        )
        .order_by("-id")
        .first()
    )
    if reserved is None or (reserved.noise_multiplier, reserved.sample_rate, reserved.steps) != (
        release.noise_multiplier,
        release.sample_rate,
        release.steps,
    ):
        return None
    owed = max(reserved.micro_epsilon, 1) if dataset.onchain_id else 0
    RoundAction.objects.filter(pk=claim.pk).update(budget_charged=True, privacy_unsent=owed)
    return owed


def spent_with_update(claim: RoundAction) -> None:
    """The update that carried the spend is on chain: nothing of this claim is unsent."""
    RoundAction.objects.filter(pk=claim.pk).update(privacy_unsent=0)


def owe_nothing(claim: RoundAction) -> None:
    """A training release withheld (never published) owes its update's submit nothing: ``withheld``
    recorded it on chain on its own (kind WITHHELD). The local budget still counts it."""
    RoundAction.objects.filter(pk=claim.pk).update(privacy_unsent=0)


def _open_reservations(dataset, job_id: int, round_: int, kind: str) -> list[PrivacyRelease]:
    return list(
        PrivacyRelease.objects.filter(
            dataset_id=dataset.pk,
            job=str(job_id),
            round=round_,
            kind=kind,
            status=PrivacyRelease.Status.RESERVED,
        ).order_by("-id")[:MAX_SPENDS_PER_ROUND]
    )


def _record_withheld(dataset, job_id: int, round_: int, release: PrivacyRelease) -> None:
    """Every release on chain: a training release computed and never published is recorded with
    spendPrivacy (kind WITHHELD, its steps), its spend having had no update to travel with.

    Possible only while its round is open (the chain takes spends for the current round, or the
    next while the current one aggregates): a release of a round the chain has left stays on this
    node's record alone, logged. A score release is on chain before it is computed already.
    """
    if release.kind == PrivacyRelease.Kind.SCORE_COUNT or not dataset.onchain_id:
        return
    try:
        chain.spend_privacy(job_id, round_, max(release.micro_epsilon, 1), SpendKind.WITHHELD, release.steps)
    except LedgerError as exc:
        logger.warning(
            "job %s round %s: the withheld %s release could not be recorded on chain: %s",
            job_id,
            round_,
            release.kind,
            exc,
        )


def _reserve_locally(claim: RoundAction, dataset, job_id: int, round_: int, release: ReleasePlan) -> Charge:
    # Open reservations of this release belong to attempts this node lost (a restart): computed
    # or not, nobody knows, so each is a withheld release, recorded on chain (the first few: the
    # chain takes at most MAX_SPENDS_PER_ROUND a round).
    lost = _open_reservations(dataset, job_id, round_, release.kind)
    withhold_abandoned(dataset, job_id, round_, release.kind)
    for abandoned in lost[:1]:
        _record_withheld(dataset, job_id, round_, abandoned)
    charge = reserve_release(dataset, job_id, round_, release)
    # A DP job's contract refuses an update without the round's spend: a release whose increase
    # rounds to nothing is still recorded as the smallest amount.
    owed = max(charge.micro_epsilon, 1) if charge.onchain_id else 0
    RoundAction.objects.filter(pk=claim.pk).update(budget_charged=True, privacy_unsent=owed)
    return replace(charge, micro_epsilon=owed)


def await_spend(claim: RoundAction, spending: Future | None) -> None:
    """Nothing computed on the data leaves this node before the chain recorded its cost."""
    if spending is None:
        return
    spending.result(timeout=SPEND_TIMEOUT_S)
    RoundAction.objects.filter(pk=claim.pk).update(privacy_unsent=0)


def released(dataset, job_id: int, round_: int, kind: str) -> None:
    _settle(mark_released, dataset, job_id, round_, kind)


def withheld(dataset, job_id: int, round_: int, kind: str) -> None:
    """The release was computed and is discarded unpublished: withheld (still counted), and a
    training release recorded on chain as such (``_record_withheld``)."""
    if kind == "none":
        return
    pending = _open_reservations(dataset, job_id, round_, kind)[:1]
    _settle(mark_withheld, dataset, job_id, round_, kind)
    for release in pending:  # withheld now, not by an earlier attempt of this action
        _record_withheld(dataset, job_id, round_, release)


def _settle(mark, dataset, job_id: int, round_: int, kind: str) -> None:
    if kind == "none":  # a job without DP reserves nothing
        return
    try:
        mark(dataset, job_id, round_, kind)
    except ReleaseNotReserved:  # a retried action already settled it
        logger.debug("release %s of job %s round %s was already settled", kind, job_id, round_)


__all__ = [
    "Charge",
    "await_spend",
    "node_plan",
    "owe_nothing",
    "released",
    "reserve",
    "reserve_for_update",
    "reuse_for_update",
    "scores_per_round",
    "spent_with_update",
    "withheld",
]
