"""Per-dataset privacy budgets: every DP release recorded, composed with RDP, and checked strictly.

The accounting is the learning core's (``fl_node.privacy``). Each release the node computes on a
dataset (a round's DP-SGD run, an update-level Gaussian release, a committee's noised scores) is
one ``PrivacyRelease`` row holding its ``ReleasePlan``. A dataset's spend is the RDP composition
of every release on every dataset of its budget group (datasets that share records, see
``BudgetGroup``), which is valid for any interleaving of rounds and jobs and far tighter than
adding per-job epsilons. The group's cap is its members' smallest cap and its delta their
smallest delta. Its adjacency is add-remove when every member registered a DP count of its
records (``fl_node.dp_count``; the count is the member's first release, kind ``count``), and
replace-one when any member registered its exact size: replace-one's curve is the larger one,
so it bounds the others' releases too.

The round driver charges a release before it computes it: ``reserve_release`` is the strict
part. Under the budget group's row lock it refuses (``BudgetExceeded``) a release that would pass
the cap and otherwise records it as ``reserved``; a reservation counts against the cap at once.
Once the output is published the driver calls ``mark_released``; an output computed and then
discarded is ``mark_withheld`` (still counted: nothing proves nobody saw it). The on-chain record
(spendPrivacy) may be sent in the background with ``send_spend`` while the node trains, as long
as the caller waits for it before it publishes anything computed on the data.

``reserve_budget`` / ``charge_budget`` are the earlier, round-less calls, kept for their callers:
they record a release already counted as released.

Cost: ``fl_node.privacy`` caches the one-step RDP curve of each mechanism, so composing a
group's whole history on every check costs microseconds per distinct mechanism.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import transaction

from backend.api.errors import BudgetExceeded, Conflict, InvalidInput
from backend.datasets import chain
from backend.datasets.models import BudgetGroup, Dataset, PrivacyRelease
from backend.ledger import access as ledger_access
from backend.ledger.resources import SpendKind
from fl_node.privacy import (
    ADD_REMOVE,
    REPLACE_ONE,
    BudgetLedger,
    PrivacyBudgetExceeded,
    PrivacyHistory,
    ReleasePlan,
    rdp_epsilon,
)

logger = logging.getLogger(__name__)

# One thread, so a node's spendPrivacy transactions go out in the order they were charged.
_chain_sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="privacy-spend")

EXPLANATION = (
    "Totals compose every release with the RDP accountant, so they are less than the sum of the "
    "jobs' epsilons; reserved releases count against the cap at once and are shown apart."
)
MAX_ROUND = 2**31 - 1  # PositiveIntegerField on every backend
MAX_STEPS = 2**31 - 1
MAX_JOB_LENGTH = 80
# The ``job`` of a dataset's registered count (no job: every job of the dataset rests on it).
REGISTRATION = "registration"
_COUNTED = (PrivacyRelease.Status.RELEASED, PrivacyRelease.Status.WITHHELD)
_LOCK_ATTEMPTS = 8
# Lost attempts of one release withheld at most this many at a time (a bound, not an expectation).
MAX_ABANDONED = 16


class ReleaseNotReserved(Conflict):
    """mark_released / mark_withheld of a release that was never reserved (or cannot change now)."""


@dataclass(frozen=True)
class Charge:
    """A release recorded in the local ledger; ``micro_epsilon`` is still to be spent on chain."""

    epsilon: float  # the budget's epsilon after the release (reservations included)
    onchain_id: str  # "" for a dataset that is not registered on chain
    job: str
    micro_epsilon: int
    round: int = 0
    # what the chain records (DataRegistry.PrivacySpent): scores, or a training release and its steps
    kind: SpendKind = SpendKind.UPDATE
    steps: int = 0

    @property
    def onchain(self) -> bool:
        return bool(self.onchain_id) and self.micro_epsilon > 0


# ----------------------------------------------------------------------------- the group's terms


@dataclass(frozen=True)
class GroupTerms:
    """The budget that applies to a dataset: its group's members, smallest cap, smallest delta
    and adjacency (add-remove only if every member registered a DP count)."""

    group_id: int | None
    members: tuple[int, ...]
    epsilon_cap: float
    delta: float
    adjacency: str = REPLACE_ONE

    def ledger(self, history: PrivacyHistory) -> BudgetLedger:
        return BudgetLedger(
            epsilon_cap=self.epsilon_cap, delta=self.delta, history=history, adjacency=self.adjacency
        )


def adjacency_of(count_noise_stds: Iterable[float]) -> str:
    """A budget's adjacency from its datasets' registered count noise (0: the exact size)."""
    stds = list(count_noise_stds)
    return ADD_REMOVE if stds and all(std > 0 for std in stds) else REPLACE_ONE


def group_terms(dataset: Dataset) -> GroupTerms:
    # The group is read afresh: an upload may have merged the dataset's group since it was loaded.
    group_id = Dataset.objects.filter(pk=dataset.pk).values_list("budget_group_id", flat=True).first()
    rows = (
        list(
            Dataset.objects.filter(budget_group_id=group_id)
            .order_by("pk")
            .values_list("pk", "epsilon_cap", "delta", "count_noise_std")
        )
        if group_id is not None
        else []
    )
    if not rows:
        std = Dataset.objects.filter(pk=dataset.pk).values_list("count_noise_std", flat=True).first()
        return GroupTerms(None, (dataset.pk,), dataset.epsilon_cap, dataset.delta, adjacency_of([std or 0.0]))
    return GroupTerms(
        group_id,
        tuple(row[0] for row in rows),
        min(row[1] for row in rows),
        min(row[2] for row in rows),
        adjacency_of(row[3] for row in rows),
    )


def _group_releases(terms: GroupTerms):
    return PrivacyRelease.objects.filter(dataset_id__in=terms.members).order_by("id")


def compose(releases: Iterable[PrivacyRelease]) -> PrivacyHistory:
    history = PrivacyHistory()
    for release in releases:
        history.record(
            noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
        )
    return history


def budget_ledger(dataset: Dataset) -> BudgetLedger:
    """The dataset's budget: its group's cap and the composed history of every release, reserved too."""
    terms = group_terms(dataset)
    return terms.ledger(compose(_group_releases(terms)))


# ----------------------------------------------------------------------------- charging


def _ensure_group(dataset: Dataset) -> int:
    """The dataset's budget group id, creating a group of its own the first time (no upload made one)."""
    current = Dataset.objects.filter(pk=dataset.pk).values_list("budget_group_id", flat=True).first()
    if current is not None:
        return current
    group = BudgetGroup.objects.create()
    if not Dataset.objects.filter(pk=dataset.pk, budget_group__isnull=True).update(budget_group=group):
        group.delete()  # another charge made one first
    return Dataset.objects.filter(pk=dataset.pk).values_list("budget_group_id", flat=True).get()


def _lock_budget(dataset: Dataset) -> GroupTerms:
    """Lock the dataset's budget group (in a transaction) and return its terms.

    Lock order: the group row, then the dataset row; an upload that merges groups locks groups
    first too, so the two never deadlock. If the group was merged away while we waited, the
    dataset now points at another group: lock that one.
    """
    for _ in range(_LOCK_ATTEMPTS):
        group_id = _ensure_group(dataset)
        BudgetGroup.objects.select_for_update().filter(pk=group_id).first()
        locked = Dataset.objects.select_for_update().get(pk=dataset.pk)
        if locked.budget_group_id == group_id:
            return group_terms(locked)
    raise Conflict(f"the budget of dataset {dataset.pk} kept changing while it was being charged; retry")


def _round_number(round_) -> int:
    """``round_`` if it is a round number; InvalidInput otherwise (None included)."""
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ <= MAX_ROUND:
        raise InvalidInput(f"round must be an integer in [0, {MAX_ROUND}], got {round_!r}")
    return round_


def _check_round(round_) -> int | None:
    """A round number, or None: a release recorded without a round (reserve_budget)."""
    return None if round_ is None else _round_number(round_)


def _record(
    dataset: Dataset, job, round_, plan: ReleasePlan, status: str, *, micro_epsilon: int | None = None
) -> Charge:
    if not isinstance(plan, ReleasePlan):
        raise InvalidInput(f"a release is charged with a ReleasePlan, got {type(plan).__name__}")
    round_ = _check_round(round_)
    job = str(job)
    if not 0 < len(job) <= MAX_JOB_LENGTH:
        raise InvalidInput(f"a job id has 1 to {MAX_JOB_LENGTH} characters")
    if plan.steps > MAX_STEPS:  # the column's bound; no real release comes near it
        raise InvalidInput(f"a release has at most {MAX_STEPS} steps, got {plan.steps}")
    terms = _lock_budget(dataset)
    ledger = terms.ledger(compose(_group_releases(terms)))
    spent_before = ledger.spent()
    try:
        projected = ledger.check(
            noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, steps=plan.steps
        )
    except PrivacyBudgetExceeded as exc:
        shared = f" (a budget shared by datasets {list(terms.members)})" if len(terms.members) > 1 else ""
        raise BudgetExceeded(f"dataset {dataset.name!r}{shared}: {exc}") from exc
    # At least one micro-epsilon: the chain needs a recorded spend for every published release
    # (submitUpdate and revealScores refuse without), even one that moves the composed curve by less.
    increase = max(math.ceil((projected - spent_before) * chain.MICRO_EPSILON), 1)
    if micro_epsilon is not None:  # what the chain was told already (a registration's count)
        increase = micro_epsilon
    PrivacyRelease.objects.create(
        dataset_id=dataset.pk,
        job=job,
        round=round_,
        kind=plan.kind,
        noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate,
        steps=plan.steps,
        delta=terms.delta,
        epsilon_after=projected,
        micro_epsilon=increase,
        status=status,
    )
    scores = plan.kind == PrivacyRelease.Kind.SCORE_COUNT
    return Charge(
        projected,
        dataset.onchain_id,
        job,
        increase,
        round=round_ or 0,
        kind=SpendKind.SCORES if scores else SpendKind.UPDATE,
        steps=0 if scores else plan.steps,
    )


@transaction.atomic
def record_count(dataset: Dataset, plan: ReleasePlan, *, micro_epsilon: int) -> Charge:
    """The dataset's registered DP count, its first release: checked against the cap and recorded
    as released, with the ``micro_epsilon`` the chain recorded with the registration."""
    if plan.kind != PrivacyRelease.Kind.COUNT:
        raise InvalidInput(f"a registration's release is a count, not {plan.kind!r}")
    return _record(
        dataset, REGISTRATION, None, plan, PrivacyRelease.Status.RELEASED, micro_epsilon=micro_epsilon
    )


@transaction.atomic
def reserve_release(dataset: Dataset, job: str | int, round_: int, plan: ReleasePlan) -> Charge:
    """Check ``plan`` against the budget and record it as reserved; BudgetExceeded records nothing.

    The reservation counts against the cap from now on, whatever becomes of the release.
    """
    return _record(dataset, job, round_, plan, PrivacyRelease.Status.RESERVED)


def _settle(dataset: Dataset, job, round_, kind: str, status: str) -> PrivacyRelease:
    with transaction.atomic():
        mine = PrivacyRelease.objects.select_for_update().filter(
            dataset_id=dataset.pk, job=str(job), round=_check_round(round_), kind=kind
        )
        reserved = mine.filter(status=PrivacyRelease.Status.RESERVED).order_by("-id").first()
        if reserved is not None:
            reserved.status = status
            reserved.save(update_fields=["status", "updated"])
            return reserved
        settled = mine.filter(status=status).order_by("-id").first()
        if settled is not None:  # a retried action marks again: nothing changes
            return settled
    raise ReleaseNotReserved(
        f"no reserved {kind} release of job {job} round {round_} on dataset {dataset.pk} to mark {status}"
    )


def mark_released(dataset: Dataset, job: str | int, round_: int, kind: str) -> PrivacyRelease:
    """The release's output was published (update or scores submitted)."""
    return _settle(dataset, job, round_, kind, PrivacyRelease.Status.RELEASED)


def mark_withheld(dataset: Dataset, job: str | int, round_: int, kind: str) -> PrivacyRelease:
    """The release's output was computed but discarded unpublished; it stays counted."""
    return _settle(dataset, job, round_, kind, PrivacyRelease.Status.WITHHELD)


def withhold_abandoned(dataset: Dataset, job: str | int, round_: int, kind: str) -> int:
    """Mark withheld the reservations of (job, round, kind) still open; returns how many.

    Called before a new attempt of the same release is reserved: an open reservation then belongs
    to an attempt this node lost (a restart, an evicted cache), whose output was never published.
    It stays counted. At most ``MAX_ABANDONED`` at a time (a bound, not an expectation).
    """
    with transaction.atomic():
        open_ids = list(
            PrivacyRelease.objects.select_for_update()
            .filter(
                dataset_id=dataset.pk,
                job=str(job),
                round=_check_round(round_),
                kind=kind,
                status=PrivacyRelease.Status.RESERVED,
            )
            .order_by("-id")
            .values_list("pk", flat=True)[:MAX_ABANDONED]
        )
        for release in PrivacyRelease.objects.filter(pk__in=open_ids):
            release.status = PrivacyRelease.Status.WITHHELD
            release.save(update_fields=["status", "updated"])  # save(): ``updated`` is auto_now
    return len(open_ids)


def settle_closed(
    dataset: Dataset, job: str | int, before_round: int, published: Callable[[int, str], bool]
) -> tuple[int, int]:
    """Settle the reservations of ``job``'s rounds before ``before_round``; returns (released, withheld).

    ``withhold_abandoned`` settles a lost attempt only when the same release is attempted again;
    a node killed while it trained or scored a round that then closed without it never attempts
    that release again, so its reservation would stay open for good (and the job's privacy would
    never be final). The caller names the rounds the chain has closed (no output of theirs can
    be published any more) and says which releases the chain shows published (``published(round,
    kind)``: the update or the scores went out before the node died): those become released,
    every other one withheld. Both stay counted. At most ``MAX_ABANDONED`` rows a call.
    """
    before_round = _round_number(before_round)  # None would be a database error in round__lt
    released = withheld = 0
    with transaction.atomic():
        open_rows = list(
            PrivacyRelease.objects.select_for_update()
            .filter(
                dataset_id=dataset.pk,
                job=str(job),
                round__lt=before_round,
                status=PrivacyRelease.Status.RESERVED,
            )
            .order_by("id")[:MAX_ABANDONED]
        )
        for release in open_rows:
            assert release.round is not None  # round__lt matches no NULL round
            if published(release.round, release.kind):
                release.status = PrivacyRelease.Status.RELEASED
                released += 1
            else:
                release.status = PrivacyRelease.Status.WITHHELD
                withheld += 1
            release.save(update_fields=["status", "updated"])  # save(): ``updated`` is auto_now
    return released, withheld


@transaction.atomic
def record_chain_release(
    dataset: Dataset,
    job: str | int,
    round_: int,
    plan: ReleasePlan,
    *,
    micro_epsilon: int,
    withheld: bool = False,
) -> PrivacyRelease:
    """Record a release the chain holds for this node and its database lost (restored from a backup
    taken before it; ``backend.jobs.driver.reconcile``), from the job's public plan: released (or
    withheld), WITHOUT the cap check. It happened, so refusing it would only hide it; every later
    release is checked against a budget that counts it. ``micro_epsilon``: what the chain recorded."""
    if not isinstance(plan, ReleasePlan):
        raise InvalidInput(f"a release is recorded with a ReleasePlan, got {type(plan).__name__}")
    round_ = _round_number(round_)
    job = str(job)
    if not 0 < len(job) <= MAX_JOB_LENGTH or plan.steps > MAX_STEPS:
        raise InvalidInput(
            f"a job id has 1 to {MAX_JOB_LENGTH} characters and a release at most {MAX_STEPS} steps"
        )
    terms = _lock_budget(dataset)
    history = compose(_group_releases(terms)).extended(
        noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, steps=plan.steps
    )
    return PrivacyRelease.objects.create(
        dataset_id=dataset.pk,
        job=job,
        round=round_,
        kind=plan.kind,
        noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate,
        steps=plan.steps,
        delta=terms.delta,
        epsilon_after=rdp_epsilon(history, delta=terms.delta, adjacency=terms.adjacency),
        micro_epsilon=micro_epsilon,
        status=PrivacyRelease.Status.WITHHELD if withheld else PrivacyRelease.Status.RELEASED,
    )


@transaction.atomic
def reserve_budget(
    dataset: Dataset, job: str | int, *, noise_multiplier: float, sample_rate: float, steps: int
) -> Charge:
    """A round-less release, checked against the cap and recorded as released at once (earlier callers).

    A rate of 1 for one step is the update-level mechanism's shape; anything else is DP-SGD.
    """
    kind = "update_gaussian" if sample_rate == 1.0 and steps == 1 else "dp_sgd"
    try:
        plan = ReleasePlan(kind, noise_multiplier, sample_rate, steps)
    except (ValueError, TypeError) as exc:  # a mechanism the accountant rejects (negative noise, rate > 1)
        raise InvalidInput(str(exc)) from exc
    return _record(dataset, job, None, plan, PrivacyRelease.Status.RELEASED)


# ----------------------------------------------------------------------------- reading


def _epsilon(releases: list[PrivacyRelease], delta: float, adjacency: str) -> float:
    return rdp_epsilon(compose(releases), delta=delta, adjacency=adjacency) if releases else 0.0


@dataclass(frozen=True)
class Spend:
    spent: float  # released + withheld
    reserved: float  # what the reserved releases add on top of ``spent``

    @property
    def total(self) -> float:
        return self.spent + self.reserved


def spend_of(releases: list[PrivacyRelease], delta: float, adjacency: str) -> Spend:
    counted = [r for r in releases if r.status in _COUNTED]
    spent = _epsilon(counted, delta, adjacency)
    total = _epsilon(releases, delta, adjacency) if len(counted) < len(releases) else spent
    return Spend(spent, max(total - spent, 0.0))


def _job_releases(dataset: Dataset, job: str | int, adjacency: str) -> list[PrivacyRelease]:
    """``job``'s releases on the dataset; under add-remove led by the dataset's registered count,
    which that adjacency rests on (a job's figure includes it: ``fl_node.privacy_plan.job_epsilon``)."""
    releases = list(dataset.releases.filter(job=str(job)).order_by("id"))
    if adjacency != ADD_REMOVE:
        return releases
    return list(dataset.releases.filter(kind=PrivacyRelease.Kind.COUNT).order_by("id")) + releases


def job_spend(
    dataset: Dataset, job: str | int, *, delta: float | None = None, adjacency: str | None = None
) -> Spend:
    """What ``job``'s own releases on the dataset cost, composed on their own: at ``delta`` and
    ``adjacency`` (the job's, for a figure shown as the job's), or the budget group's by default."""
    terms = group_terms(dataset)
    adjacency = adjacency or terms.adjacency
    at = delta if delta is not None else terms.delta
    return spend_of(_job_releases(dataset, job, adjacency), at, adjacency)


def job_epsilon(
    dataset: Dataset, job: str | int, *, delta: float | None = None, adjacency: str | None = None
) -> float:
    """What ``job`` alone spent on the dataset (released and withheld; at the group's delta and
    adjacency by default)."""
    terms = group_terms(dataset)
    adjacency = adjacency or terms.adjacency
    releases = [r for r in _job_releases(dataset, job, adjacency) if r.status in _COUNTED]
    return _epsilon(releases, delta or terms.delta, adjacency)


def _rounds(releases: list[PrivacyRelease]) -> int:
    numbered = {r.round for r in releases if r.round is not None}
    return len(numbered) + sum(1 for r in releases if r.round is None)


def budget_summary(dataset: Dataset) -> dict:
    """The budget as the API shows it: spent (released + withheld) and reserved apart, per job too."""
    terms = group_terms(dataset)
    releases = list(_group_releases(terms))
    spend = spend_of(releases, terms.delta, terms.adjacency)
    by_job: dict[str, list[PrivacyRelease]] = {}
    for release in releases:
        by_job.setdefault(release.job, []).append(release)
    return {
        "epsilon_cap": terms.epsilon_cap,
        "delta": terms.delta,
        "epsilon_spent": spend.spent,
        "epsilon_reserved": spend.reserved,
        "epsilon_left": max(terms.epsilon_cap - spend.total, 0.0),
        "spent_by_jobs": [
            {
                "job": job,
                "epsilon": _epsilon([r for r in rows if r.status in _COUNTED], terms.delta, terms.adjacency),
                "rounds": _rounds(rows),
            }
            for job, rows in sorted(by_job.items())
        ],
        "budget_group": list(terms.members),
        "adjacency": terms.adjacency,
        "explanation": EXPLANATION,
    }


def send_spend(charge: Charge) -> Future:
    """DataRegistry.spendPrivacy of a reserved charge, sent on a background thread.

    The ledger is resolved here, in the caller's thread (tests route it per node). The
    future's result is the transaction hash (None without a ledger or nothing to spend); its
    exception is the chain's (a revert past the chain's cap, the chain unreachable).
    """
    ledger = ledger_access.node_ledger() if charge.onchain else None
    if ledger is None:
        done: Future = Future()
        done.set_result(None)
        return done

    def send() -> str:
        return ledger.fl.spend_privacy(
            int(charge.job), charge.round, charge.micro_epsilon, charge.kind, charge.steps
        ).tx_hash

    return _chain_sender.submit(send)


@transaction.atomic
def charge_budget(
    dataset: Dataset, job: str | int, *, noise_multiplier: float, sample_rate: float, steps: int
) -> float:
    """Record a run of ``steps`` DP steps by ``job`` locally and on chain; returns the epsilon after.

    One step: the spendPrivacy transaction is sent and awaited inside the local transaction,
    so if the chain refuses it the local record is rolled back too.
    """
    charge = reserve_budget(
        dataset, job, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps
    )
    if charge.onchain:
        chain.spend_privacy(charge.job, charge.round, charge.micro_epsilon, charge.kind, charge.steps)
    return charge.epsilon
