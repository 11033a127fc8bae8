"""This node's privacy releases that the chain holds and its database lost, recorded again.

After `manage.py node restore` from a backup older than some of this node's releases, the chain
still holds their spends (DataRegistry.PrivacySpent, mirrored as ledger.PrivacyRecord with kind
and steps) but the dataset's local budget (backend.datasets.budget) does not: the node would go
on releasing as if they had not happened. The agent reconciles once the mirror holds the records
(its planning ticks): each of this node's on-chain spends without a local release of the same
(dataset, job, round, kind) is recorded locally from the job's public plan (the plan every member
computes, driver/privacy.node_plan), as released (withheld for a withheld update), without the
cap check (budget.record_chain_release). Outside a restore nothing is ever missing: the driver
reserves a release locally BEFORE its spend goes on chain, so the local releases of a (job,
round, kind) are never fewer than the chain's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from backend.datasets.budget import record_chain_release
from backend.datasets.models import Dataset, PrivacyRelease
from backend.jobs.context import NodeContext
from backend.jobs.discovery import config_of, job_record
from backend.jobs.driver.privacy import node_plan
from backend.ledger import models as mirror
from fl_node.privacy_plan import PrivacyPlan, spend_release

logger = logging.getLogger(__name__)

_SCORES = 1  # PrivacyRecord.Kind.SCORES; 0 (an update) and 2 (a withheld update) are training
_WITHHELD = 2
# (on-chain dataset id, job id, round, training?) -> the chain's records in chain order
Key = tuple[int, int, int, bool]


@dataclass(frozen=True)
class Reconciled:
    recorded: int  # releases recorded locally now
    pending: int  # on-chain spends not recorded yet: their job's configuration is not readable here yet


def _chain_spends(address: str, datasets: dict[int, Dataset]) -> dict[Key, list[tuple[int, int, int]]]:
    rows = (
        mirror.PrivacyRecord.objects.filter(spender__iexact=address, dataset__dataset_id__in=list(datasets))
        .order_by("block", "log_index")
        .values_list("dataset__dataset_id", "job_id", "round", "kind", "steps", "amount")
    )
    spends: dict[Key, list[tuple[int, int, int]]] = defaultdict(list)
    for dataset_id, job_id, round_, kind, steps, amount in rows:
        spends[(int(dataset_id), int(job_id), int(round_), kind != _SCORES)].append(
            (kind, steps, int(amount))
        )
    return spends


def _local_counts(datasets: dict[int, Dataset], jobs: set[int]) -> dict[Key, int]:
    onchain = {dataset.pk: dataset_id for dataset_id, dataset in datasets.items()}
    rows = PrivacyRelease.objects.filter(
        dataset_id__in=list(onchain), job__in=[str(j) for j in jobs]
    ).values_list("dataset_id", "job", "round", "kind")
    counts: dict[Key, int] = defaultdict(int)
    for dataset_pk, job, round_, kind in rows:
        if round_ is not None:
            counts[(onchain[dataset_pk], int(job), round_, kind != PrivacyRelease.Kind.SCORE_COUNT)] += 1
    return counts


def _plan(ctx: NodeContext, job_id: int, dataset: Dataset) -> PrivacyPlan | None:
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None:
        return None
    try:
        config = config_of(job_record(ctx, job_id))
    except Exception as exc:  # not fetched yet (no peer holds it now): the next pass tries again
        logger.warning(
            "cannot reconcile job %s's releases yet: its configuration is unreadable (%s)", job_id, exc
        )
        return None
    return node_plan(ctx, job, config, dataset)


def reconcile_releases(ctx: NodeContext) -> Reconciled:
    """Record locally every on-chain spend of this node that its database lost; see the module."""
    datasets = {
        int(d.onchain_id): d for d in Dataset.objects.exclude(onchain_id="") if d.onchain_id.isdigit()
    }
    if not datasets:
        return Reconciled(0, 0)
    spends = _chain_spends(ctx.address, datasets)
    counts = _local_counts(datasets, {job_id for _, job_id, _, _ in spends})
    recorded = pending = 0
    plans: dict[tuple[int, int], PrivacyPlan | None] = {}
    for key, chain_spends in spends.items():
        dataset_id, job_id, round_, _training = key
        missing = chain_spends[counts.get(key, 0) :]  # the local ones stand for the first
        if not missing:
            continue
        dataset = datasets[dataset_id]
        if (job_id, dataset_id) not in plans:
            plans[(job_id, dataset_id)] = _plan(ctx, job_id, dataset)
        plan = plans[(job_id, dataset_id)]
        if plan is None:
            pending += len(missing)
            continue
        for kind, steps, amount in missing:
            release = spend_release(plan, kind, steps)
            if release is None:  # a spend the plan says costs nothing: nothing to compose
                continue
            record_chain_release(
                dataset, job_id, round_, release, micro_epsilon=amount, withheld=kind == _WITHHELD
            )
            recorded += 1
    if recorded:
        logger.warning(
            "recorded %d privacy release(s) the chain holds and this node's database had lost", recorded
        )
    return Reconciled(recorded, pending)
