"""Dataset flows: upload (validate -> encrypt -> store -> register on chain -> save), grants, loading.

An upload's records are hashed one by one: the content hash (order-insensitive) is registered on
chain once, and the keyed record hashes put a dataset that shares records with one this node
holds into that dataset's budget group (backend.datasets.overlap).

Each flow is a module function that undoes its earlier steps when a later one
fails, so a failed request leaves no row, no pinned blob and no file behind. The
chain has no "unregister": a registration is the last external step, and only the
local save (which cannot conflict after the checks) follows it.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from eth_utils import is_address, to_checksum_address

from backend.api.errors import Conflict, InvalidInput, NotFound, ServiceUnavailable
from backend.datasets import chain, keys, overlap, storage
from backend.datasets.formats import CanonicalDataset, DatasetFormatError, deserialize, parse_csv, parse_npz
from backend.datasets.models import Dataset, Grant
from backend.identity.key import node_account
from backend.ledger import models as mirror
from backend.ledger.errors import ContractRevert

logger = logging.getLogger(__name__)
PUBLIC_HOLDOUT_DOMAIN = b"defl-public-holdout-v1\n"
# A record can be 2 bytes of npz, so the upload size alone would let tens of millions of record
# hashes into the database; 1,000,000 is far above any dataset this node trains on in memory.
MAX_RECORDS = 1_000_000


@dataclass(frozen=True)
class Upload:
    name: str
    format: str
    data: bytes
    epsilon_cap: float
    delta: float
    label_column: str = ""
    classes: tuple[str, ...] = ()
    public_holdout: bool = False


def parse_upload(upload: Upload) -> CanonicalDataset:
    classes = list(upload.classes) or None
    try:
        if upload.format == Dataset.Format.CSV:
            return parse_csv(upload.data, upload.label_column, classes)
        if upload.format == Dataset.Format.NPZ:
            return parse_npz(upload.data, classes, max_unpacked_bytes=settings.DEFL_MAX_DATASET_BYTES)
    except DatasetFormatError as exc:
        raise InvalidInput(str(exc), field="file") from exc
    raise InvalidInput(f"unknown format {upload.format!r}", field="format")


def create_dataset(upload: Upload, owner=None) -> Dataset:
    canonical = parse_upload(upload)
    if canonical.num_samples > MAX_RECORDS:
        raise InvalidInput(
            f"the dataset has {canonical.num_samples} records; a node takes at most {MAX_RECORDS} per "
            "dataset (each record's hash is kept to find overlapping datasets)",
            field="file",
        )
    check_delta(upload.delta, canonical.num_samples, field="delta")
    _refuse_registered_records(canonical)
    digests = overlap.keyed_digests(canonical.record_digests)

    reference = storage.store_encrypted(canonical.serialized)
    try:
        try:
            registration = chain.register_dataset(
                content_hash=canonical.content_hash,
                swarm_root=storage.root_address(reference),
                schema_hash=canonical.schema_hash,
                samples=canonical.num_samples,
                epsilon_cap=upload.epsilon_cap,
                **_holdout_declaration(upload, canonical),
            )
        except ContractRevert as exc:
            if exc.error != "DuplicateDataset":
                raise
            existing = exc.args_.get("existingId", "?")
            raise InvalidInput(
                f"these records are already registered as dataset {existing} on chain "
                "(the same records in any order have one content hash, and one privacy budget)",
                field="file",
            ) from None
        return _save_dataset(upload, canonical, reference, registration, owner, digests)
    except BaseException:
        # Undo the store step; a chain registration (if it happened) stays as an orphan
        # record that no local row points to, which is harmless: it holds no key.
        _discard_quietly(reference)
        raise


def _holdout_declaration(upload: Upload, canonical) -> dict:
    """The public hold-out declaration for the chain: a hash bound to these records, or nothing."""
    if not upload.public_holdout:
        return {}
    digest = hashlib.sha256(PUBLIC_HOLDOUT_DOMAIN + bytes.fromhex(canonical.content_hash)).hexdigest()
    return {"public_holdout_hash": digest}


def check_delta(delta: float, records: int, *, field: str) -> None:
    """delta at most 1/(10 n): a larger delta would allow a mechanism that publishes a record outright."""
    limit = 1.0 / (10 * max(int(records), 1))
    if not delta <= limit:
        raise InvalidInput(
            f"delta {delta:g} is too large for a dataset of {records} records: it must be at most "
            f"1/(10·n) = {limit:.3g}",
            field=field,
        )


def _refuse_registered_records(canonical) -> None:
    """The same records (in any order) registered here or, as far as the mirror knows, on chain."""
    local = Dataset.objects.filter(content_hash__in=(canonical.content_hash, canonical.blob_hash)).first()
    if local is not None:
        raise InvalidInput(
            f"these records are already registered as dataset {local.pk} ({local.name!r}) on this node",
            field="file",
        )
    on_chain = mirror.Dataset.objects.filter(
        content_hash__in=(canonical.content_hash, "0x" + canonical.content_hash)
    ).first()
    if on_chain is not None:
        raise InvalidInput(
            f"these records are already registered as dataset {on_chain.dataset_id} on chain",
            field="file",
        )


def _save_dataset(upload, canonical, reference, registration, owner, digests) -> Dataset:
    overlap.ensure_a_group_row()
    try:
        with transaction.atomic():
            overlap.lock_all_groups()
            dataset = Dataset.objects.create(
                name=upload.name,
                owner=owner,
                format=upload.format,
                num_samples=canonical.num_samples,
                feature_shape=list(canonical.feature_shape),
                num_features=canonical.num_features,
                classes=list(canonical.classes),
                label_column=upload.label_column,
                schema_hash=canonical.schema_hash,
                content_hash=canonical.content_hash,
                size_bytes=len(canonical.serialized),
                encrypted_reference=reference,
                status=Dataset.Status.REGISTERED if registration else Dataset.Status.STORED,
                onchain_id=registration.onchain_id if registration else "",
                tx_hash=registration.tx_hash if registration else "",
                epsilon_cap=upload.epsilon_cap,
                delta=upload.delta,
                public_holdout=upload.public_holdout,
            )
            overlap.join_budget_group(dataset, digests)
            return dataset
    except IntegrityError as exc:  # a concurrent upload of the same content won the race
        raise InvalidInput("these records were registered by a concurrent upload", field="file") from exc


def _discard_quietly(reference: str) -> None:
    try:
        storage.discard(reference)
    except Exception:  # the original error matters more; the collector retries orphans
        logger.exception("could not unpin %s… after a failed upload", reference[:16])


# ----------------------------------------------------------------------------- grants


def _grantee_address(node: str) -> str:
    if not is_address(node):
        raise InvalidInput(f"{node!r} is not a chain address", field="node")
    return to_checksum_address(node)


def _require_registered(dataset: Dataset) -> None:
    if not dataset.onchain_id:
        raise Conflict("the dataset is not registered on chain yet, so it cannot be granted")


def grant_access(dataset: Dataset, node: str) -> Grant:
    grantee = _grantee_address(node)
    _require_registered(dataset)
    if dataset.grants.filter(grantee=grantee, revoked__isnull=True).exists():
        raise Conflict(f"{grantee} already has access to this dataset")
    try:
        public_key = chain.node_public_key(grantee)
    except chain.LedgerMissing as exc:
        raise ServiceUnavailable(str(exc)) from exc
    if public_key is None:
        raise NotFound(f"{grantee} is not a node registered on chain")
    wrapped = keys.wrap_key(public_key, dataset.encrypted_reference)
    tx_hash = chain.grant(dataset.onchain_id, grantee, wrapped)
    # The chain accepted the grant; the local row is our record of it (the indexer mirrors the event).
    return Grant.objects.create(dataset=dataset, grantee=grantee, wrapped_key=wrapped.hex(), tx_hash=tx_hash)


def revoke_access(dataset: Dataset, node: str) -> Grant:
    grantee = _grantee_address(node)
    grant = dataset.grants.filter(grantee=grantee, revoked__isnull=True).first()
    if grant is None:
        raise NotFound(f"{grantee} has no access to this dataset")
    try:
        tx_hash = chain.revoke(dataset.onchain_id, grantee)
    except chain.LedgerMissing as exc:
        raise ServiceUnavailable(str(exc)) from exc
    grant.revoked = timezone.now()
    grant.revoke_tx_hash = tx_hash
    grant.save(update_fields=["revoked", "revoke_tx_hash"])
    return grant


# ----------------------------------------------------------------------------- loading


def load_dataset_arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    """(x float32, y int64) of a dataset this node owns or was granted, checked against its hash.

    ``dataset`` is a local ``Dataset`` (owned: its reference is stored here) or a
    grant to this node from the ledger's mirror (``backend.ledger.models.Grant``, or
    anything with ``wrapped_key`` and a ``content_hash`` of its own or of its
    ``dataset``): its key is unwrapped with this node's key.
    """
    reference = getattr(dataset, "encrypted_reference", None) or _unwrap_grant(dataset)
    expected = getattr(dataset, "content_hash", None) or dataset.dataset.content_hash
    canonical = deserialize(storage.fetch(reference, max_bytes=getattr(dataset, "size_bytes", None)))
    if _hex(expected) not in (canonical.content_hash, canonical.blob_hash):
        raise Conflict("the fetched dataset does not match its content hash")
    return canonical.x, canonical.y


def _unwrap_grant(granted) -> str:
    wrapped = granted.wrapped_key
    wrapped = bytes.fromhex(_hex(wrapped)) if isinstance(wrapped, str) else bytes(wrapped)
    try:
        return keys.unwrap_key(node_account().key, wrapped)
    except ValueError as exc:
        raise Conflict("this grant was not wrapped for this node's key") from exc


def _hex(value) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value.removeprefix("0x").lower()
