"""Datasets that share records share a privacy budget: keyed per-record hashes and budget groups.

At upload every record's digest (``CanonicalDataset.record_digests``) is keyed with an HMAC
under a node-local secret and kept, truncated to 128 bits. A new dataset that shares ANY record
with a dataset this node holds joins that dataset's budget group; if it overlaps several groups,
they merge into one. The keyed hashes reveal nothing to someone holding a copy of the database
without the node's secret (a plain hash of a record could be tested against guesses).

The key is derived from DJANGO_SECRET_KEY: a node that changes its secret key no longer links
new uploads to the records hashed before (their groups stay as they are).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError

from backend.datasets.models import BudgetGroup, Dataset, RecordHash

_KEY_CONTEXT = b"defl record hashes v1"
DIGEST_HEX = 32  # 128 bits: collisions among a node's records are out of reach
_QUERY_CHUNK = 500
LOCK_GROUP_ID = 1


def record_key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def keyed_digests(record_digests: Iterable[bytes]) -> list[str]:
    """The records' keyed hashes (hex), each once, in a stable order."""
    key = record_key()
    keyed = {hmac.new(key, digest, hashlib.sha256).hexdigest()[:DIGEST_HEX] for digest in record_digests}
    return sorted(keyed)


def ensure_a_group_row() -> None:
    """Outside any transaction, before an upload's: make sure there is a group row to lock.

    On an empty table ``lock_all_groups`` would lock nothing, and the node's first two uploads
    could miss each other's records; an empty group with a fixed id (never any dataset's, since
    new groups are created empty and only joined) gives them a row to queue on.
    """
    if not BudgetGroup.objects.exists():
        try:
            BudgetGroup.objects.get_or_create(pk=LOCK_GROUP_ID)
        except IntegrityError:  # a concurrent upload created it first
            pass


def lock_all_groups() -> None:
    """Serialize uploads with each other and with charges (inside the caller's transaction).

    A charge locks one group then its dataset; an upload locks every group (in id order) before
    it writes datasets, so the two take locks in the same order, and two uploads that overlap
    cannot both miss each other's record hashes.
    """
    list(BudgetGroup.objects.select_for_update().order_by("pk").values_list("pk", flat=True))


def join_budget_group(dataset: Dataset, digests: list[str]) -> BudgetGroup:
    """Store the dataset's keyed record hashes and put it in the budget group of every dataset it
    overlaps (merging their groups); a dataset that overlaps none gets a group of its own.

    Call inside a transaction, after ``lock_all_groups``.
    """
    RecordHash.objects.bulk_create(
        [RecordHash(dataset=dataset, digest=digest) for digest in digests], batch_size=1000
    )
    overlapping: set[int] = set()
    for start in range(0, len(digests), _QUERY_CHUNK):
        chunk = digests[start : start + _QUERY_CHUNK]
        overlapping.update(
            RecordHash.objects.filter(digest__in=chunk)
            .exclude(dataset_id=dataset.pk)
            .values_list("dataset_id", flat=True)
            .distinct()
        )
    groups = set(
        Dataset.objects.filter(pk__in=overlapping, budget_group__isnull=False).values_list(
            "budget_group_id", flat=True
        )
    )
    group = BudgetGroup.objects.get(pk=min(groups)) if groups else BudgetGroup.objects.create()
    # Members of the merged groups, and overlapping datasets that had no group yet, move too.
    Dataset.objects.filter(budget_group_id__in=groups - {group.pk}).update(budget_group=group)
    Dataset.objects.filter(pk__in=overlapping, budget_group__isnull=True).update(budget_group=group)
    Dataset.objects.filter(pk=dataset.pk).update(budget_group=group)
    dataset.budget_group = group
    return group
