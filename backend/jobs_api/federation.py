"""Who in the federation can join a job of one schema, read from the chain's mirror.

A member can join with a dataset registered on chain that it owns or was granted (an active
grant), of the job's schema, whose privacy budget left still covers the job's target epsilon.
The job form shows the members this finds and fits its committee and trainers to them; the
create flow refuses a job that could never start on them (backend.jobs_api.services).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.ledger import models as mirror
from fl_node.job.limits import MICRO_EPSILON

MAX_DATASETS_READ = 5000
MAX_GRANTS_READ = 20000


@dataclass(frozen=True)
class Joinable:
    address: str
    name: str


def joinable_members(schema_hash: str, target_epsilon: float | None) -> list[Joinable]:
    """The members that could join a job of ``schema_hash`` needing ``target_epsilon`` (None: no DP)."""
    need = int((target_epsilon or 0) * MICRO_EPSILON)
    datasets = {
        d.dataset_id: d
        for d in mirror.Dataset.objects.filter(schema_hash__iexact=_hex(schema_hash))[:MAX_DATASETS_READ]
        if d.privacy_cap - d.privacy_spent >= need
    }
    usable: dict[str, set[int]] = {}
    for dataset in datasets.values():
        usable.setdefault(dataset.owner.lower(), set()).add(dataset.dataset_id)
    grants = mirror.Grant.objects.filter(active=True, dataset__dataset_id__in=list(datasets))[
        :MAX_GRANTS_READ
    ]
    for grantee, dataset_id in grants.values_list("grantee", "dataset__dataset_id"):
        usable.setdefault(grantee.lower(), set()).add(dataset_id)
    members = mirror.Node.objects.filter(status=mirror.Node.Status.MEMBER).order_by("name", "address")
    return [Joinable(node.address, node.name) for node in members if usable.get(node.address.lower())]


def _hex(schema_hash: str) -> str:
    """The mirror keeps hashes as 0x-hex; a job config names its schema without the prefix."""
    return schema_hash if schema_hash.startswith("0x") else "0x" + schema_hash
