"""Which budget a new dataset joins: its provider's shared source, or its own; keyed record hashes.

Budgets are per source, not per upload. A provider's datasets share ONE budget (the node's
``shared`` group, the chain's budget source of its owner) unless the provider declares a dataset
disjoint at upload (recorded on chain): then it has a budget of its own. Record hashes cannot
find every copy (a dataset rescaled, or jittered by one ulp, shares no record hash with the
original), so sharing is the default and disjointness a declaration the provider answers for.

Record hashes check the declarations this node can check. At upload every record's digest
(``CanonicalDataset.record_digests``) is keyed with an HMAC under a node-local secret and kept,
truncated to 128 bits. A dataset declared disjoint that shares ANY record with a dataset this
node holds is refused, and so is a dataset that shares records with one declared disjoint: one
record's spends must count against one source on chain. The keyed hashes reveal nothing to
someone holding a copy of the database without the node's secret (a plain hash of a record
could be tested against guesses), and the same key makes the local content hash that refuses
the same records twice.

The key is derived from DJANGO_SECRET_KEY: a node that changes its secret key no longer links
new uploads to the records hashed before (their groups stay as they are).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError

from backend.api.errors import InvalidInput
from backend.datasets.models import BudgetGroup, Dataset, RecordHash

_KEY_CONTEXT = b"defl record hashes v1"
_CONTENT_DOMAIN = b"defl-local-content-v2\n"
DIGEST_HEX = 32  # 128 bits: collisions among a node's records are out of reach
_QUERY_CHUNK = 500
LOCK_GROUP_ID = 1


def record_key() -> bytes:
    return hmac.new(settings.SECRET_KEY.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def local_content_hash(record_digests: Iterable[bytes]) -> str:
    """The records' order-insensitive hash keyed with this node's record key (hex): local only,
    it refuses the same records uploaded twice to this node."""
    joined = b"".join(sorted(record_digests))
    return hmac.new(record_key(), _CONTENT_DOMAIN + joined, hashlib.sha256).hexdigest()


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


def overlapping_datasets(digests: list[str], *, exclude: int | None = None) -> list[Dataset]:
    """The datasets this node holds that share at least one of these keyed record hashes."""
    found: set[int] = set()
    for start in range(0, len(digests), _QUERY_CHUNK):
        chunk = digests[start : start + _QUERY_CHUNK]
        rows = RecordHash.objects.filter(digest__in=chunk)
        if exclude is not None:
            rows = rows.exclude(dataset_id=exclude)
        found.update(rows.values_list("dataset_id", flat=True).distinct())
    return list(Dataset.objects.filter(pk__in=found).order_by("pk"))


def check_declaration(overlapping: list[Dataset], *, disjoint: bool) -> None:
    """InvalidInput when the declaration contradicts the records this node holds."""
    if not overlapping:
        return
    names = ", ".join(f"{d.pk} ({d.name!r})" for d in overlapping[:5])
    if disjoint:
        raise InvalidInput(
            f"this dataset was declared disjoint but shares records with dataset(s) {names} on this node; "
            "upload it without the declaration so that it shares their budget",
            field="disjoint",
        )
    declared = [d for d in overlapping if d.disjoint]
    if declared:
        names = ", ".join(f"{d.pk} ({d.name!r})" for d in declared[:5])
        raise InvalidInput(
            f"this dataset shares records with dataset(s) {names}, declared disjoint with a budget of "
            "their own on chain: its spends could not count against theirs",
            field="file",
        )


def shared_group() -> BudgetGroup:
    """The node's one group of datasets not declared disjoint (created on first use).

    Call inside a transaction, after ``lock_all_groups`` (which serializes its creation).
    """
    group = BudgetGroup.objects.filter(shared=True).order_by("pk").first()
    return group if group is not None else BudgetGroup.objects.create(shared=True)


def join_budget_group(dataset: Dataset, digests: list[str]) -> BudgetGroup:
    """Store the dataset's keyed record hashes and put it in its budget group: the node's shared
    group, or (declared disjoint) a group of its own. Overlapping datasets that had no group
    yet (made without an upload) join it too; a declaration the records contradict is refused.

    Call inside a transaction, after ``lock_all_groups``.
    """
    overlapping = overlapping_datasets(digests, exclude=dataset.pk)
    check_declaration(overlapping, disjoint=dataset.disjoint)
    RecordHash.objects.bulk_create(
        [RecordHash(dataset=dataset, digest=digest) for digest in digests], batch_size=1000
    )
    group = BudgetGroup.objects.create() if dataset.disjoint else shared_group()
    # Datasets this one overlaps are not disjoint (checked above): their groups merge into it.
    groups = {d.budget_group_id for d in overlapping if d.budget_group_id is not None} - {group.pk}
    Dataset.objects.filter(budget_group_id__in=groups).update(budget_group=group)
    Dataset.objects.filter(pk__in=[d.pk for d in overlapping], budget_group__isnull=True).update(
        budget_group=group
    )
    Dataset.objects.filter(pk=dataset.pk).update(budget_group=group)
    dataset.budget_group = group
    return group
