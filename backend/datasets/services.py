"""Dataset flows: upload (validate -> encrypt -> store -> register on chain -> save), grants, loading.

An upload's records are hashed one by one. The chain registers a commitment keyed with the
dataset's own secret (backend.datasets.commitment), never a plain function of the records; this
node keeps a content hash keyed with its record key to refuse the same records twice, and keyed
record hashes that check the upload's budget declaration (backend.datasets.overlap): a provider's
datasets share one budget unless declared disjoint.

Each flow is a module function that undoes its earlier steps when a later one
fails, so a failed request leaves no row, no pinned blob and no file behind. The
chain has no "unregister": a registration is the last external step, and only the
local save (which cannot conflict after the checks) follows it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from eth_utils import is_address, to_checksum_address

from backend.api.errors import Conflict, InvalidInput, NotFound, ServiceUnavailable
from backend.datasets import budget, chain, commitment, keys, overlap, storage
from backend.datasets.formats import CanonicalDataset, DatasetFormatError, deserialize, parse_csv, parse_npz
from backend.datasets.models import Dataset, Grant
from backend.identity.key import node_account
from backend.ledger.errors import ContractRevert
from backend.swarm.errors import SwarmError
from fl_node.dp_count import COUNT_NOISE_STD, blob_capacity, count_release, noisy_count
from fl_node.privacy import ADD_REMOVE, rdp_epsilon

logger = logging.getLogger(__name__)
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
    disjoint: bool = False


def parse_upload(upload: Upload) -> CanonicalDataset:
    if not upload.classes:
        # Inferred from the labels present, the class list (on chain in the schema hash) would
        # tell anyone who knows the other records whether a record with a rare label is in.
        raise InvalidInput(
            "declare the class names (comma-separated, in class-id order): a list inferred from the "
            "labels present would be published with the dataset's schema and tell other members "
            "which labels your records hold",
            field="classes",
        )
    classes = list(upload.classes)
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
    # A refusal is seen by the uploader only, so it may read the exact size. (A job's plan checks
    # delta against the registered count, which any member can: near the bound it may refuse.)
    check_delta(upload.delta, canonical.num_samples, field="delta")
    count_spend = _count_spend(upload)
    # The size the chain registers: a DP count, never the exact size (fl_node.dp_count).
    registered = noisy_count(canonical.num_samples)
    canonical = canonical.first(blob_capacity(registered))
    local_hash = overlap.local_content_hash(canonical.record_digests)
    _refuse_registered_records(canonical, local_hash)
    digests = overlap.keyed_digests(canonical.record_digests)
    # Checked again under the upload lock when the row is saved; here so that a contradicted
    # declaration is refused before anything is registered on chain.
    overlap.check_declaration(overlap.overlapping_datasets(digests), disjoint=upload.disjoint)
    secret = commitment.new_secret()
    committed = commitment.commitment(secret, canonical.record_digests)

    # Padded to a size that follows from the registered count alone: the swarm's blobs are public.
    blob = canonical.padded(blob_capacity(registered))
    reference = storage.store_encrypted(blob)
    try:
        try:
            registration = chain.register_dataset(
                commitment=committed,
                swarm_root=storage.root_address(reference),
                schema_hash=canonical.schema_hash,
                samples=registered,
                epsilon_cap=upload.epsilon_cap,
                disjoint=upload.disjoint,
                initial_spend=count_spend,
                **_holdout_declaration(upload, canonical, secret),
            )
        except ContractRevert as exc:
            if exc.error != "DuplicateDataset":
                raise
            existing = exc.args_.get("existingId", "?")
            raise InvalidInput(
                f"this commitment is already registered as dataset {existing} on chain", field="file"
            ) from None
        keyed = _Keyed(secret=secret, commitment=committed, local_hash=local_hash)
        stored = _Stored(
            reference=reference, registered=registered, size_bytes=len(blob), count_spend=count_spend
        )
        return _save_dataset(upload, canonical, stored, registration, owner, digests, keyed)
    except BaseException:
        # Undo the store step; a chain registration (if it happened) stays as an orphan
        # record that no local row points to, which is harmless: it holds no key.
        _discard_quietly(reference)
        raise


def _count_spend(upload: Upload) -> int:
    """The registered count's own epsilon at the dataset's delta, in micro-epsilon: what the chain
    records with the registration (at least the rise it gives the budget, which composes it)."""
    alone = rdp_epsilon(count_release().history(), delta=upload.delta, adjacency=ADD_REMOVE)
    if alone >= upload.epsilon_cap:
        raise InvalidInput(
            f"an epsilon cap of {upload.epsilon_cap:g} leaves nothing once the dataset's size is "
            f"released (a DP count costs {alone:.3g} at delta {upload.delta:g})",
            field="epsilon_cap",
        )
    return math.ceil(alone * chain.MICRO_EPSILON)


@dataclass(frozen=True)
class _Stored:
    reference: str  # the encrypted blob (padded to the count's capacity)
    registered: int  # the DP count registered on chain
    size_bytes: int
    count_spend: int  # micro-epsilon the chain recorded for the count


@dataclass(frozen=True)
class _Keyed:
    secret: str  # the dataset's secret (never leaves this node)
    commitment: str  # registered on chain
    local_hash: str  # this node's keyed content hash


def _holdout_declaration(upload: Upload, canonical, secret: str) -> dict:
    """The public hold-out declaration for the chain: a commitment to its records, or nothing."""
    if not upload.public_holdout:
        return {}
    return {"public_holdout_hash": commitment.holdout_commitment(secret, canonical.record_digests)}


def check_delta(delta: float, records: int, *, field: str) -> None:
    """delta at most 1/(10 n): a larger delta would allow a mechanism that publishes a record outright."""
    limit = 1.0 / (10 * max(int(records), 1))
    if not delta <= limit:
        raise InvalidInput(
            f"delta {delta:g} is too large for a dataset of {records} records: it must be at most "
            f"1/(10·n) = {limit:.3g}",
            field=field,
        )


def _refuse_registered_records(canonical, local_hash: str) -> None:
    """The same records (in any order) uploaded to this node before (its keyed content hash, or
    the plain one of a dataset uploaded before commitments were keyed). Records another node
    registered cannot be recognised from its keyed commitment: see docs/PRIVACY.md."""
    local = Dataset.objects.filter(
        content_hash__in=(local_hash, canonical.content_hash, canonical.blob_hash)
    ).first()
    if local is not None:
        raise InvalidInput(
            f"these records are already registered as dataset {local.pk} ({local.name!r}) on this node",
            field="file",
        )


def _save_dataset(upload, canonical, stored: _Stored, registration, owner, digests, keyed: _Keyed) -> Dataset:
    overlap.ensure_a_group_row()
    try:
        with transaction.atomic():
            overlap.lock_all_groups()
            dataset = Dataset.objects.create(
                name=upload.name,
                owner=owner,
                format=upload.format,
                num_samples=stored.registered,
                records=canonical.num_samples,
                count_noise_std=COUNT_NOISE_STD,
                feature_shape=list(canonical.feature_shape),
                num_features=canonical.num_features,
                classes=list(canonical.classes),
                label_column=upload.label_column,
                schema_hash=canonical.schema_hash,
                content_hash=keyed.local_hash,
                secret=keyed.secret,
                commitment=keyed.commitment,
                disjoint=upload.disjoint,
                onchain_source=registration.source_id if registration else "",
                size_bytes=stored.size_bytes,
                encrypted_reference=stored.reference,
                status=Dataset.Status.REGISTERED if registration else Dataset.Status.STORED,
                onchain_id=registration.onchain_id if registration else "",
                tx_hash=registration.tx_hash if registration else "",
                epsilon_cap=upload.epsilon_cap,
                delta=upload.delta,
                public_holdout=upload.public_holdout,
            )
            overlap.join_budget_group(dataset, digests)
            budget.record_count(dataset, count_release(), micro_epsilon=stored.count_spend)
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


def grant_access(dataset: Dataset, node: str, epsilon_cap: float | None = None) -> Grant:
    """Give ``node`` the data key and a cap on the privacy its jobs may spend from the dataset
    (on chain, within the dataset's own budget; by default the dataset's whole cap)."""
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
    cap = dataset.epsilon_cap if epsilon_cap is None else epsilon_cap
    tx_hash = chain.grant(dataset.onchain_id, grantee, wrapped, cap)
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
    with transaction.atomic():
        grant.revoked = timezone.now()
        grant.revoke_tx_hash = tx_hash
        grant.save(update_fields=["revoked", "revoke_tx_hash"])
        Dataset.objects.filter(pk=dataset.pk).update(key_rotation_requested=timezone.now())
    # Rotated at once where the chain and the store answer; otherwise the agent tries again each
    # tick (rotate_due_keys): the revocation on chain is what stops the grantee's spends.
    _try_rotation(dataset)  # it reads the dataset's row again once it holds the claim
    return grant


def _try_rotation(dataset: Dataset) -> bool:
    """One try at a due rotation; False when it did not finish (or another process has it).
    Whatever stopped it (the chain, the store, anything else) is logged, never raised: the
    revocation it follows is done, and the agent's loop that retries it must go on."""
    try:
        return rotate_data_key(dataset) is not None
    except (chain.LedgerMissing, ContractRevert, SwarmError, OSError) as exc:
        logger.warning("dataset %s: the data key is not rotated yet (%s); the agent retries", dataset.pk, exc)
    except Exception:  # noqa: BLE001 - see the docstring
        logger.exception("dataset %s: rotating the data key failed; the agent retries", dataset.pk)
    return False


# A rotation claimed longer ago than this belongs to a process that stopped mid-rotation: another
# may take it over (each step is safe to send again).
ROTATION_LEASE_S = 600.0


def rotate_data_key(dataset: Dataset) -> str | None:
    """Re-encrypt ``dataset`` under a fresh data key after a revocation, as far as it got before:
    the same canonical bytes stored again (every chunk under a fresh random key,
    backend.swarm.crypto) and made the dataset's reference, the reference it replaced kept as
    ``retired_reference``; every live grant wrapped again for the new reference on chain, with the
    cap the chain holds for it; the new root recorded (``rotateKey``); then the retired blob
    unpinned. Each step may be sent again (a grant again re-wraps; rotateKey sets the same root),
    so a rotation cut short resumes where it stopped. One process rotates a dataset at a time (the
    request that revoked and the agent's retries share a claim), and a revocation that comes in
    while a rotation runs leaves another one due (the grantee it revoked may have been re-wrapped
    for). Returns the rotateKey transaction hash; None when no rotation is due or another process
    has it.

    What it gives: a revoked grantee's wrapped key opens only the retired blob, which this node no
    longer keeps; other members' copies of those chunks go only when their collectors drop them
    (docs/PRIVACY.md, "What a revocation ends"), and what the grantee read before it stays read."""
    claimed = timezone.now()
    stale = claimed - timedelta(seconds=ROTATION_LEASE_S)
    free = Q(key_rotation_claimed__isnull=True) | Q(key_rotation_claimed__lt=stale)
    if not Dataset.objects.filter(free, pk=dataset.pk, key_rotation_requested__isnull=False).update(
        key_rotation_claimed=claimed
    ):
        return None
    try:
        dataset.refresh_from_db()
        tx_hash = _rotate(dataset)
    finally:
        Dataset.objects.filter(pk=dataset.pk, key_rotation_claimed=claimed).update(key_rotation_claimed=None)
    # Done, unless a revocation came in after the claim (it asks for another rotation).
    Dataset.objects.filter(pk=dataset.pk, key_rotation_requested__lte=claimed).update(
        key_rotation_requested=None
    )
    dataset.refresh_from_db()
    logger.info("dataset %s: data key rotated (%s)", dataset.pk, tx_hash)
    return tx_hash


def _rotate(dataset: Dataset) -> str:
    _require_registered(dataset)
    if not dataset.retired_reference:
        fresh = storage.store_encrypted(
            storage.fetch(dataset.encrypted_reference, max_bytes=dataset.size_bytes)
        )
        Dataset.objects.filter(pk=dataset.pk).update(
            retired_reference=dataset.encrypted_reference, encrypted_reference=fresh
        )
        dataset.refresh_from_db()
    for grant in dataset.grants.filter(revoked__isnull=True):
        public_key = chain.node_public_key(grant.grantee)
        if public_key is None:  # it left the registry: the chain refuses a grant to a non-member
            logger.warning(
                "dataset %s: %s is no member now; its grant is not re-wrapped", dataset.pk, grant.grantee
            )
            continue
        try:
            wrapped = keys.wrap_key(public_key, dataset.encrypted_reference)
        except InvalidInput as exc:  # its registered key is no curve point: nothing to wrap for
            logger.warning("dataset %s: %s's grant is not re-wrapped: %s", dataset.pk, grant.grantee, exc)
            continue
        grant.tx_hash = chain.grant(
            dataset.onchain_id, grant.grantee, wrapped, chain.grant_cap(dataset.onchain_id, grant.grantee)
        )
        grant.wrapped_key = wrapped.hex()
        grant.save(update_fields=["wrapped_key", "tx_hash"])
    tx_hash = chain.rotate_key(dataset.onchain_id, storage.root_address(dataset.encrypted_reference))
    storage.discard(dataset.retired_reference)
    Dataset.objects.filter(pk=dataset.pk).update(retired_reference="")
    return tx_hash


def rotate_due_keys() -> int:
    """Every rotation a revocation left due (the chain or the store did not answer then), tried
    once more; returns how many were done. Run by the agent each tick."""
    due = Dataset.objects.filter(key_rotation_requested__isnull=False).exclude(onchain_id="")
    return sum(_try_rotation(dataset) for dataset in due)


def regrant_carried() -> int | None:
    """After a contract upgrade (docs/OPERATIONS.md, Upgrades) the new DataRegistry holds this
    node's datasets but none of their grants: version 1 kept the wrapped keys only in its events.
    Each grant this node issued and still holds live is granted again, with the same wrapped key
    and the dataset's cap, when the chain does not hold it; returns how many. None (nothing done)
    while the import is open (the contracts take no write then) or on contracts that carried
    nothing. A grantee that is no longer a member is left out (and logged)."""
    if not chain.carried_over():
        return None
    granted = 0
    live = (
        Grant.objects.filter(revoked__isnull=True).exclude(dataset__onchain_id="").select_related("dataset")
    )
    for grant in live:
        dataset = grant.dataset
        if chain.is_granted(dataset.onchain_id, grant.grantee):
            continue
        try:
            tx_hash = chain.grant(
                dataset.onchain_id, grant.grantee, bytes.fromhex(grant.wrapped_key), dataset.epsilon_cap
            )
        except ContractRevert as exc:
            logger.warning("cannot grant dataset %s to %s again: %s", dataset.onchain_id, grant.grantee, exc)
            continue
        grant.tx_hash = tx_hash
        grant.save(update_fields=["tx_hash"])
        granted += 1
    return granted


# ----------------------------------------------------------------------------- loading


def load_dataset_arrays(dataset) -> tuple[np.ndarray, np.ndarray]:
    """(x float32, y int64) of a dataset this node owns or was granted, checked where it can be.

    ``dataset`` is a local ``Dataset`` (owned: its reference is stored here) or a grant to this
    node from the ledger's mirror (``backend.ledger.models.Grant``, or anything with
    ``wrapped_key`` and a ``content_hash`` of its own or of its ``dataset``): its key is
    unwrapped with this node's key. An owned dataset is checked against its commitment (keyed
    with its secret). A granted one is read by its content-addressed swarm reference (every
    chunk is checked against its address); its keyed commitment cannot be recomputed without
    the owner's secret, so only a plain content hash (a dataset registered before commitments
    were keyed) is compared.
    """
    canonical = load_canonical(dataset)
    return canonical.x, canonical.y


def load_canonical(dataset) -> CanonicalDataset:
    """The dataset's canonical form, fetched and checked as ``load_dataset_arrays`` says."""
    reference = getattr(dataset, "encrypted_reference", None) or _unwrap_grant(dataset)
    canonical = deserialize(storage.fetch(reference, max_bytes=getattr(dataset, "size_bytes", None)))
    expected = _registered_value(dataset)
    if expected in (canonical.content_hash, canonical.blob_hash):
        return canonical  # registered with a plain content hash (before commitments were keyed)
    secret = getattr(dataset, "secret", "")
    if secret and commitment.commitment(secret, canonical.record_digests) == expected:
        return canonical
    if secret or getattr(dataset, "encrypted_reference", None):
        raise Conflict("the fetched dataset does not match its commitment")
    return canonical  # granted: its keyed commitment needs the owner's secret; the swarm checked the chunks


@dataclass(frozen=True)
class LocalSplit:
    """A dataset's records and its (train, validation) indices in one job."""

    x: np.ndarray  # float32
    y: np.ndarray  # int64
    train: np.ndarray  # sorted indices
    validation: np.ndarray  # sorted indices


def load_split(dataset: Dataset, *, val_fraction: float, job_seed: int | str) -> LocalSplit:
    """This node's dataset split for one job, each record's side keyed with the dataset's secret
    (``commitment.job_holdout``): D and D plus x differ in x alone on each side. A dataset that
    declared its hold-out public validates on that one hold-out in every job."""
    if not dataset.secret:
        raise Conflict(f"dataset {dataset.pk} has no secret to split its records with")
    canonical = load_canonical(dataset)
    train, validation = commitment.job_holdout(
        dataset.secret,
        canonical.record_digests,
        public=dataset.public_holdout,
        val_fraction=val_fraction,
        job_seed=job_seed,
    )
    return LocalSplit(
        np.ascontiguousarray(canonical.x, dtype=np.float32),
        np.ascontiguousarray(canonical.y, dtype=np.int64),
        np.sort(train),
        np.sort(validation),
    )


def _registered_value(dataset) -> str:
    """What the chain registered for the dataset (hex): its commitment, or for a dataset registered
    before commitments were keyed its plain content hash; a grant reads its dataset's."""
    for holder in (dataset, getattr(dataset, "dataset", None)):
        value = getattr(holder, "commitment", None) or getattr(holder, "content_hash", None)
        if value:
            return _hex(value)
    return ""


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
