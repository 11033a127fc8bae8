"""Sealed updates: nobody reads a trainer's update before the round's training deadline.

An update's reference is in the public ``UpdateSubmitted`` event while the round still trains,
so a blob stored in the clear could be read, lightly altered and resubmitted by any member. The
trainer therefore stores its update encrypted (AES-256-GCM under a fresh random key, never
derived from anything public) and submits the sealed blob's reference with the hash of the
PLAINTEXT, so duplicate and hash checks keep their meaning. The key stays in this node's
database (``UpdateKey``) until the training is over by the chain's clock: the round left
training, its update deadline passed, or every trainer's update is in (nobody can submit after
that). Then it is served to the job's participants only, over a node-signed peer request
(``backend.peers.guard.peer_signed``: signature, freshness, receiver, registry membership,
replay and rate), and only for an update on chain with this reference and hash.

Every node that obtains a key checks it (the blob opens, and the plaintext hashes to the content
hash on chain), keeps it and serves it on: a trainer that went offline once the committee
fetched its key does not stop the aggregation. A key that never arrives makes the update
unreadable, which the committee scores 0 like any other unreadable update.

Sealed blob: ``MAGIC | nonce (12) | ciphertext | tag (16)``; the key is 32 bytes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import requests
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.db import IntegrityError, close_old_connections

from backend.jobs import blobs, chain
from backend.jobs.context import NodeContext, PeerAccess
from backend.jobs.driver import timing
from backend.jobs.driver.memory import SealedMemory
from backend.jobs.driver.state import ActionError
from backend.jobs.models import UpdateKey
from backend.ledger import models as mirror
from fl_node.codec import OwnedBuffer
from fl_node.codec import content_hash as hash_of

logger = logging.getLogger(__name__)

MAGIC = b"DFS1"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = len(MAGIC) + NONCE_BYTES + TAG_BYTES  # a sealed blob is this much larger than its update
KEY_PATH = "/api/jobs/peer/update-key"
# A key request is a small JSON object, its answer one hex key: anything larger is refused unread.
MAX_REQUEST_BYTES = 512
MAX_ANSWER_BYTES = 1024
# Holders asked for one key in one call at most (the trainer first, then relays).
MAX_HOLDERS = 32
# A holder that failed to answer is not asked again for this long (a trainer gone offline).
HOLDER_DOWN_S = 10.0
CONNECT_TIMEOUT_S = 2.0
# Seconds past a time-based update deadline before a key is handed out: the clock skew between
# this node and the chain's block producer that a late submit could otherwise use.
RELEASE_SLACK_S = 1
READ_TIMEOUT_S = 5.0
# Keys of one round asked for at the same time (gather_keys): one thread per update, at most this many.
KEY_THREADS = 16
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_MAX_ID = 2**64 - 1

# What a node remembers of the holders (not answering lately) and the keys gathered but not read
# yet is its own, in ``ctx.memory.sealed`` (backend.jobs.driver.memory), bounded by MAX_OFFERS.
MAX_OFFERS = 4096
# The threads that ask for a round's keys (gather_keys) are the process's, not a node's: they
# keep nothing between requests (each call hands its node's memory to its own), as the cluster's
# thread pools (backend.cluster.priority) do; a restart (``memory.clear()``) has nothing to forget there.
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


class SealError(blobs.BlobMismatch):
    """A sealed blob that is malformed, or does not open under a key to its recorded hash."""


class WrongContent(SealError):
    """The key opens the sealed blob, but not to the content hash on chain.

    AES-GCM authenticates under the key: a holder cannot make an honest trainer's blob open to
    other bytes (that needs the blob to be made for two keys, by its maker). So the trainer's own
    submission is at fault: a copied blob under a hash of its own, or a blob made to mislead.
    """


class KeyUnavailable(ActionError):
    """No key for the update yet: not released, or no holder answered (retried later)."""


class KeyRefused(Exception):
    """A key request this node does not answer: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


# ---------------------------------------------------------------------------------------- crypto
def seal(plaintext: bytes) -> tuple[bytes, bytes]:
    """(sealed blob, key): a fresh random key and nonce for every update."""
    key = AESGCM.generate_key(bit_length=8 * KEY_BYTES)
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, MAGIC), key


def unseal(blob: bytes, key: bytes, expected_hash: str | bytes) -> bytes:
    """The update inside ``blob``, if ``key`` opens it and it hashes to ``expected_hash`` (else SealError).

    ``expected_hash``: hex (with or without 0x), or the 32 raw bytes of an event's bytes32.
    """
    if isinstance(expected_hash, bytes | bytearray):
        expected_hash = bytes(expected_hash).hex()
    if len(key) != KEY_BYTES:
        raise SealError(f"a key has {KEY_BYTES} bytes, not {len(key)}")
    if len(blob) < OVERHEAD or not blob.startswith(MAGIC):
        raise SealError("not a sealed update")
    if isinstance(blob, OwnedBuffer):  # a large blob of the caller's own (backend.jobs.blobs.get)
        return _unseal_in_place(blob, key, expected_hash.removeprefix("0x").lower())
    nonce = blob[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    try:
        plaintext = AESGCM(key).decrypt(nonce, blob[len(MAGIC) + NONCE_BYTES :], MAGIC)
    except InvalidTag:
        raise SealError("the key does not open the sealed update") from None
    if hash_of(plaintext) != expected_hash.removeprefix("0x").lower():
        raise WrongContent("the sealed update does not hash to its recorded content hash")
    return plaintext


_SLICE_BYTES = 1 << 20


def _unseal_in_place(blob: OwnedBuffer, key: bytes, expected_hash: str) -> OwnedBuffer:
    """unseal() of a blob the caller owns, in memory bounded by a slice: the same blob, now the update.

    A first pass decrypts slice by slice into a scratch buffer to check the tag and the
    plaintext's hash, leaving the blob as it was (a wrong key lets the caller try the next);
    the second decrypts it in place; then the seal's header and tag are cut off (no copy).
    """
    head, end = len(MAGIC) + NONCE_BYTES, len(blob) - TAG_BYTES
    nonce, tag = bytes(blob[len(MAGIC) : head]), bytes(blob[end:])
    scratch = bytearray(_SLICE_BYTES + 16)  # update_into wants a block's room to spare
    digest = hashlib.sha256()
    with memoryview(blob) as whole, memoryview(scratch) as out:
        for in_place in (False, True):
            decryptor = Cipher(algorithms.AES(key), modes.GCM(nonce, tag)).decryptor()
            decryptor.authenticate_additional_data(MAGIC)
            for start in range(head, end, _SLICE_BYTES):
                with whole[start : min(start + _SLICE_BYTES, end)] as piece:
                    size = decryptor.update_into(piece, out)
                    if size != len(piece):  # GCM is a stream mode
                        raise SealError("the cipher did not decrypt a slice whole")
                    if in_place:
                        piece[:] = out[:size]
                    else:
                        digest.update(out[:size])
            try:
                decryptor.finalize()
            except InvalidTag:
                raise SealError("the key does not open the sealed update") from None
            if not in_place and digest.hexdigest() != expected_hash:
                raise WrongContent("the sealed update does not hash to its recorded content hash")
    del blob[end:]
    del blob[:head]
    return blob


# ------------------------------------------------------------------------------------ the trainer
def store_own(
    ctx: NodeContext,
    job_id: int,
    round_: int,
    plaintext: bytes,
    content_hash: str,
    *,
    samples: int = 0,
    base_hash: str = "",
    kind: str = "",
    spend: int = 0,
) -> str:
    """Seal this node's update, keep its key, store the sealed blob (pinned); its reference.

    The key row is written before the blob leaves the node. A retried submit of the same update
    reuses the row's blob and key (the reference it may already have sent). ``samples``,
    ``base_hash``, ``kind`` and ``spend`` are kept with it for a retry after a restart
    (``own_unsent``).
    """
    mine: dict[str, Any] = dict(node=ctx.address, job_id=job_id, round=round_, trainer=ctx.address)
    kept = UpdateKey.objects.filter(**mine).first()
    wanted = content_hash.removeprefix("0x").lower()
    if kept is not None and kept.reference and kept.content_hash.removeprefix("0x").lower() == wanted:
        return kept.reference  # stored and pinned by the attempt that wrote the row
    if not plaintext:
        raise ValueError("an update to seal has bytes")
    blob, key = seal(plaintext)
    UpdateKey.objects.update_or_create(
        **mine,
        defaults=dict(
            reference="",
            content_hash="0x" + wanted,
            key=key.hex(),
            own=True,
            samples=samples,
            base_hash=base_hash,
            kind=kind,
            spend=spend,
        ),
    )
    reference = blobs.put(ctx, blob)
    UpdateKey.objects.filter(**mine).update(reference=reference)
    return reference


def own_unsent(ctx: NodeContext, job_id: int, round_: int) -> UpdateKey | None:
    """This node's sealed update of the round, stored (sealed, pinned) by an attempt whose submit
    did not complete; the caller checks the chain has no update of this node for the round."""
    return (
        UpdateKey.objects.filter(node=ctx.address, job_id=job_id, round=round_, trainer=ctx.address, own=True)
        .exclude(reference="")
        .filter(samples__gt=0)
        .first()
    )


# -------------------------------------------------------------------------------------- releases
def training_over(on_chain, round_: int, now: int) -> bool:
    """Whether round ``round_``'s keys may be released: by the contract's state and clock ``now``."""
    if on_chain.round > round_:
        return True
    if on_chain.round < round_:
        return False
    if on_chain.status != chain.JobStatus.RUNNING or on_chain.phase != chain.RoundPhase.TRAINING:
        return True
    trainers = on_chain.participant_count - on_chain.committee_size
    return on_chain.update_count >= trainers or now > on_chain.update_deadline


def released(ctx: NodeContext, job_id: int, round_: int) -> bool:
    """Whether this node may hand out round ``round_``'s keys now.

    Once true, true for good (a round never goes back to training): remembered by the node. Else
    this node's mirror of the chain, when it shows the training over by the job's state alone,
    and otherwise the contract, read now. The committee and the aggregator ask every trainer at
    the moment the last update lands, each answer on the round's critical path: the mirror
    answers them without two chain reads each.
    """
    memory = ctx.memory.sealed
    with memory.lock:
        if (job_id, round_) in memory.released:
            return True
    if not (_over_in_mirror(job_id, round_) or _over_on_chain(ctx, job_id, round_)):
        return False
    with memory.lock:
        if len(memory.released) >= MAX_OFFERS:  # bounded: old rounds are asked about no more
            memory.released.clear()
        memory.released.add((job_id, round_))
    return True


def _over_in_mirror(job_id: int, round_: int) -> bool:
    """Whether the mirror shows round ``round_``'s training over by the job's state: a later round,
    the round out of training, the job ended, or every trainer's update in. The mirror holds only
    the contract's own events, so it can lag the chain but never lead it (its participants are
    every ParticipantJoined of the job: the projection refuses none the contract can emit, so the
    trainers counted are never fewer than the contract's); the deadline by the clock is left to
    the contract (``_over_on_chain``)."""
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None or job.current_round < round_:
        return False
    if job.current_round > round_ or job.status != mirror.Job.Status.RUNNING:
        return True
    status = job.rounds_set.filter(number=round_).values_list("status", flat=True).first()
    if status is None:
        return False
    if status != mirror.Round.Status.TRAINING:
        return True
    trainers = job.participants.count() - job.committee_size
    return trainers > 0 and job.updates.filter(round=round_).count() >= trainers


def _over_on_chain(ctx: NodeContext, job_id: int, round_: int) -> bool:
    """The contract, read now. By block number, "past the deadline" means a block past it is mined,
    so no submit can land at or before it. By time, the contract compares the NEXT block's
    timestamp, which is the producer's clock: ``RELEASE_SLACK_S`` of clock skew is allowed for
    before a key goes out. The clock is read only when the job's state leaves it open."""
    on_chain = chain.job_state(ctx, job_id)
    if training_over(on_chain, round_, 0):  # over by the state alone: no deadline needed
        return True
    now = chain.contract_now(ctx, on_chain)
    return training_over(on_chain, round_, now if on_chain.use_blocks else now - RELEASE_SLACK_S)


def answer(ctx: NodeContext, holder: str, requester: str, job_id: int, round_: int, trainer: str) -> str:
    """The hex key ``holder`` gives ``requester`` for ``trainer``'s update, or KeyRefused.

    The one decision behind the peer endpoint (and the in-process path of ``ask``): a participant
    of the job (mirror), the round's training over (the contract, read now), an update on chain
    with the reference and hash of the key held.
    """
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None or not job.participants.filter(node__iexact=requester).exists():
        raise KeyRefused(403, f"{requester} is not a participant of job {job_id}")
    if not released(ctx, job_id, round_):
        raise KeyRefused(
            409, f"round {round_} of job {job_id} is still training: keys are released after its deadline"
        )
    held = UpdateKey.objects.filter(node=holder, job_id=job_id, round=round_, trainer__iexact=trainer).first()
    update = job.updates.filter(round=round_, trainer__iexact=trainer).first()
    if held is None or not (_same_update(held, update) if update is not None else _on_chain(ctx, held)):
        raise KeyRefused(
            404, f"this node holds no key of {trainer}'s update in round {round_} of job {job_id}"
        )
    return held.key


def _on_chain(ctx: NodeContext, held: UpdateKey) -> bool:
    """Whether the chain records ``held``'s trainer as the submitter of its content hash in its round.

    The mirror of the last trainer lags its own submit by an indexing pass, and the committee asks
    for the key the moment it sees the training over: the contract answers instead of a 404. One
    update per trainer and round, and a content hash at most once per round (both on chain): the
    key held for that hash is the key of the trainer's update on chain; the reader checks it opens
    the blob the event names to that hash.
    """
    try:
        owner = ctx.ledger.fl.content_owner(
            held.job_id, held.round, bytes.fromhex(held.content_hash.removeprefix("0x"))
        )
    except Exception as exc:  # the chain is briefly away: the asker retries
        logger.info("reading the owner of an update's hash failed: %s", exc)
        return False
    return owner.lower() == held.trainer.lower()


def parse_request(body: bytes) -> tuple[int, int, str]:
    """(job, round, trainer) of a key request's JSON body; ValueError for anything else."""
    if len(body) > MAX_REQUEST_BYTES:
        raise ValueError(f"a key request has at most {MAX_REQUEST_BYTES} bytes")
    try:
        asked = json.loads(bytes(body))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("a key request is a JSON object") from None
    if not isinstance(asked, dict):
        raise ValueError("a key request is a JSON object")
    job_id, round_, trainer = (
        _id("job", asked.get("job")),
        _id("round", asked.get("round")),
        asked.get("trainer"),
    )
    if not isinstance(trainer, str) or not _ADDRESS.match(trainer):
        raise ValueError("trainer must be a 0x-prefixed 20-byte hex address")
    return job_id, round_, trainer


def _id(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_ID:
        raise ValueError(f"{name} must be an integer in [0, 2**64)")
    return value


# --------------------------------------------------------------------------------------- readers
def read_update(
    ctx: NodeContext, job_id: int, round_: int, update, *, max_bytes: int, ask: bool = True
) -> bytes:
    """The plaintext of ``update`` (a mirror Update row), at most ``max_bytes`` encoded.

    The sealed blob is fetched first (cached: a prefetch may have it already). The key comes from
    this node's own rows, else (``ask``) from the trainer, else from any participant that relays
    it. KeyUnavailable when none has it yet; SealError (a BlobMismatch) when the blob is not a
    sealed update or does not open to the content hash on chain.
    """
    blob = blobs.get(ctx, update.reference, max_bytes=max_bytes + OVERHEAD)
    held = UpdateKey.objects.filter(
        node=ctx.address, job_id=job_id, round=round_, trainer=update.trainer
    ).first()
    if held is not None and _same_update(held, update):
        return unseal(blob, bytes.fromhex(held.key), update.content_hash)
    offered = _take_offer(ctx, job_id, round_, update)
    if offered is not None:  # gathered (gather_keys), unchecked until now
        try:
            plaintext = unseal(blob, offered, update.content_hash)
        except WrongContent:
            raise  # a key opens it, to other content: the trainer's own blob is at fault
        except SealError as exc:  # a holder's wrong answer: the holders are asked below
            logger.warning("an offered key of %s's update does not open it: %s", update.trainer, exc)
        else:
            _keep(ctx, job_id, round_, update, offered)
            return plaintext
    if not ask:
        raise KeyUnavailable(f"no key of {update.trainer}'s update yet")
    wrong: WrongContent | None = None
    for holder in _holders(ctx, job_id, update.trainer):
        key = _ask(ctx, holder, job_id, round_, update.trainer)
        if key is None:
            continue
        try:
            plaintext = unseal(blob, key, update.content_hash)
        except WrongContent as exc:  # another holder may still have the key that opens it right
            wrong = exc
            continue
        except SealError as exc:  # a key that does not open it: that holder is hostile or confused
            logger.warning("key of %s's update from %s refused: %s", update.trainer, holder, exc)
            continue
        _keep(ctx, job_id, round_, update, key)
        return plaintext
    if wrong is not None:
        raise wrong
    raise KeyUnavailable(f"no participant gave the key of {update.trainer}'s update in round {round_}")


def fetch_key(
    ctx: NodeContext,
    holders: list[str],
    job_id: int,
    round_: int,
    trainer: str,
    reference: str,
    content_hash: str,
    *,
    max_bytes: int,
) -> bytes | None:
    """A checked key of the update from the first of ``holders`` that gives one over the peer
    API, or None. Writes nothing to this node's database (a background thread's part, see
    driver/prefetch.py: the caller keeps the key with ``keep``)."""
    blob = blobs.get(ctx, reference, max_bytes=max_bytes + OVERHEAD)
    memory = ctx.memory.sealed
    for holder, key in _answers(ctx, holders, job_id, round_, trainer):
        try:
            unseal(blob, key, content_hash)
            return key
        except (KeyRefused, SealError, LookupError):
            continue
        except (ValueError, TypeError):
            _mark_down(memory, holder)
    return None


def _answers(
    ctx: NodeContext, holders: list[str], job_id: int, round_: int, trainer: str
) -> Iterator[tuple[str, bytes]]:
    """(holder, key bytes) from each of ``holders`` not marked down in the node's memory, asked in
    turn (unchecked). One that refuses is passed over; one that fails to answer is marked down for
    HOLDER_DOWN_S."""
    memory = ctx.memory.sealed
    for holder in holders:
        if _is_down(memory, holder, time.monotonic()):
            continue
        try:
            key = bytes.fromhex(_ask_peer(ctx.peers, holder, job_id, round_, trainer))
        except (KeyRefused, LookupError):
            continue
        except (requests.RequestException, ValueError, TypeError):
            _mark_down(memory, holder)
            continue
        yield holder, key


def _is_down(memory: SealedMemory, holder: str, now: float) -> bool:
    with memory.lock:
        return memory.down.get(holder, 0.0) > now


def _mark_down(memory: SealedMemory, holder: str, now: float | None = None) -> None:
    with memory.lock:
        memory.down[holder] = (time.monotonic() if now is None else now) + HOLDER_DOWN_S


def gather_keys(ctx: NodeContext, job_id: int, round_: int, updates) -> list:
    """Ask for the keys of ``updates`` (mirror Update rows) that this node does not hold, all at once;
    returns the updates no holder gave a key for (asked again later).

    Call once the round's training is over (holders refuse before). One thread per update asks its
    holders (its trainer first, then the relays), so a round's keys cost one round trip rather than
    one per update; a request already in flight for an update (``ask_ahead``) is waited on, not sent
    again. The threads fetch no blob (one encoded update in memory at a time stays the readers'
    rule) and write nothing: a key got is OFFERED to ``read_update``, which checks it on the blob it
    reads anyway (it opens, to the hash on chain) before keeping it, and asks the holders itself if
    it does not open. The call waits at most one request's timeouts (a holder that does not answer
    costs that once: it is then marked down). Updates whose holders include one in this process's
    database (several node identities in one database: the in-process tests) are left to
    ``read_update``.
    """
    asks = _asks(ctx, job_id, round_, updates)
    if not asks:
        return []
    with timing.part(timing.SWARM):  # peer transfers
        done, late = wait(asks, timeout=CONNECT_TIMEOUT_S + READ_TIMEOUT_S)
    missing = [asks[f] for f in late]
    memory = ctx.memory.sealed
    for future in done:
        update, key = asks[future], future.result()  # _first_answer raises nothing
        if key is None:
            missing.append(update)
            continue
        with memory.lock:  # also offered by _answered, which may run after this wait returned
            _put_offer(memory, _offer_key(job_id, round_, update), key)
    return missing


def ask_ahead(ctx: NodeContext, job_id: int, round_: int, updates) -> int:
    """Start asking for the keys of ``updates`` as ``gather_keys`` does, without waiting; returns how
    many requests are in flight for them.

    The committee's agent calls it in the tick whose mirror first shows the round's training over
    (driver/prefetch.py): the answers then travel while the agent plans and begins the score
    action, whose ``gather_keys`` waits on these requests instead of sending its own. Each answer
    is offered to the readers when it comes, whoever waits for it.
    """
    return len(_asks(ctx, job_id, round_, updates))


def _asks(ctx: NodeContext, job_id: int, round_: int, updates) -> dict[Future[bytes | None], Any]:
    """The key request in flight for each of ``updates`` not held or offered here, sent now where
    none is (its answer is offered by ``_answered``)."""
    held = {
        row.trainer.lower(): row
        for row in UpdateKey.objects.filter(node=ctx.address, job_id=job_id, round=round_)
    }
    memory = ctx.memory.sealed
    asks: dict[Future[bytes | None], Any] = {}
    participants: list[str] | None = None  # read once for all the updates, when one is asked for
    in_database: set[str] = set()
    for update in updates:
        row = held.get(update.trainer.lower())
        if (row is not None and _same_update(row, update)) or _offer_of(ctx, job_id, round_, update):
            continue
        offer = _offer_key(job_id, round_, update)
        with memory.lock:
            future = memory.asking.get(offer)
        if future is None:
            if participants is None:
                participants = _participants(job_id)
                in_database = set(
                    UpdateKey.objects.filter(node__in=participants).values_list("node", flat=True).distinct()
                )
            asked = _holders(ctx, job_id, update.trainer, participants)
            if in_database.intersection(asked):
                continue
            future = _executor().submit(_first_answer, ctx, asked, job_id, round_, update.trainer)
            with memory.lock:
                if len(memory.asking) >= MAX_OFFERS:  # bounded: each entry goes when answered
                    memory.asking.clear()
                memory.asking[offer] = future
            future.add_done_callback(functools.partial(_answered, memory, offer))
        asks[future] = update
    return asks


def _answered(memory: SealedMemory, offer: tuple, future: Future[bytes | None]) -> None:
    """A key request's end: no longer in flight, and its key (if any) offered to the readers."""
    key = None if future.cancelled() else future.result()  # _first_answer raises nothing
    with memory.lock:
        if memory.asking.get(offer) is not future:
            return  # forgotten meanwhile (a restart cleared the memory): nothing of it is kept
        del memory.asking[offer]
        if key is not None:
            _put_offer(memory, offer, key)


def _put_offer(memory: SealedMemory, offer: tuple, key: bytes) -> None:
    """Under ``memory.lock``."""
    if len(memory.offers) >= MAX_OFFERS:  # bounded: the oldest rounds' offers go
        memory.offers.clear()
    memory.offers[offer] = key


def _offer_key(job_id: int, round_: int, update) -> tuple:
    return (
        job_id,
        round_,
        update.trainer.lower(),
        update.reference.removeprefix("0x").lower(),
        update.content_hash.removeprefix("0x").lower(),
    )


def _offer_of(ctx: NodeContext, job_id: int, round_: int, update) -> bytes | None:
    memory = ctx.memory.sealed
    with memory.lock:
        return memory.offers.get(_offer_key(job_id, round_, update))


def _take_offer(ctx: NodeContext, job_id: int, round_: int, update) -> bytes | None:
    memory = ctx.memory.sealed
    with memory.lock:
        return memory.offers.pop(_offer_key(job_id, round_, update), None)


def _first_answer(
    ctx: NodeContext, holders: list[str], job_id: int, round_: int, trainer: str
) -> bytes | None:
    """The first 32-byte key one of ``holders`` gives over the peer API (unchecked), or None.
    No database access is needed (a static peer list; the registry's directory may read the mirror,
    whose connection this thread then closes)."""
    try:
        return next(
            (key for _, key in _answers(ctx, holders, job_id, round_, trainer) if len(key) == KEY_BYTES),
            None,
        )
    except Exception as exc:  # the reader asks again, and reports it
        logger.debug("asking for the key of %s's update: %s", trainer, exc)
        return None
    finally:
        try:
            close_old_connections()
        except Exception as exc:  # never loses the key this thread got
            logger.debug("closing a key thread's connections: %s", exc)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=KEY_THREADS, thread_name_prefix="defl-keys")
        return _pool


def keep(ctx: NodeContext, job_id: int, round_: int, update, key: bytes) -> None:
    """Keep a key checked against ``update`` (a mirror Update row, or any object with its trainer,
    reference and content_hash): this node then reads the update, and relays the key."""
    _keep(ctx, job_id, round_, update, key)


def holders(ctx: NodeContext, job_id: int, trainer: str) -> list[str]:
    return _holders(ctx, job_id, trainer)


def _same_update(held: UpdateKey, update) -> bool:
    return (
        held.reference.removeprefix("0x").lower() == update.reference.removeprefix("0x").lower()
        and held.content_hash.removeprefix("0x").lower() == update.content_hash.removeprefix("0x").lower()
    )


def _keep(ctx: NodeContext, job_id: int, round_: int, update, key: bytes) -> None:
    try:
        UpdateKey.objects.get_or_create(
            node=ctx.address,
            job_id=job_id,
            round=round_,
            trainer=update.trainer,
            defaults=dict(reference=update.reference, content_hash=update.content_hash, key=key.hex()),
        )
    except IntegrityError:  # another worker of this node kept it at the same moment
        pass


def _holders(ctx: NodeContext, job_id: int, trainer: str, participants: list[str] | None = None) -> list[str]:
    """Whom to ask: the trainer, then the job's other participants (relays), never this node.

    ``participants``: the job's (``_participants``), where the caller read them already."""
    others = _participants(job_id) if participants is None else participants
    ordered = [trainer] + [n for n in others if n.lower() != trainer.lower()]
    return [n for n in ordered if n.lower() != ctx.address.lower()][:MAX_HOLDERS]


def _participants(job_id: int) -> list[str]:
    """The job's participants in their on-chain order."""
    return list(
        mirror.Participant.objects.filter(job__job_id=job_id).order_by("index").values_list("node", flat=True)
    )


def _ask(ctx: NodeContext, holder: str, job_id: int, round_: int, trainer: str) -> bytes | None:
    """``holder``'s key of the update, or None (refused, unreachable, malformed)."""
    now = time.monotonic()
    if _is_down(ctx.memory.sealed, holder, now):
        return None
    try:
        if UpdateKey.objects.filter(node=holder).exists():
            # Several node identities in one database (the in-process tests): the holder is asked
            # directly, through the same decision its endpoint makes.
            text = answer(ctx, holder, ctx.address, job_id, round_, trainer)
        else:
            text = _ask_peer(ctx.peers, holder, job_id, round_, trainer)
        key = bytes.fromhex(text)
        if len(key) != KEY_BYTES:
            raise ValueError(f"a key of {len(key)} bytes")
        return key
    except KeyRefused as exc:
        logger.debug("%s refused the key: %s", holder, exc)
    except LookupError as exc:  # no endpoint: nothing was dialled
        logger.debug("not asking %s: %s", holder, exc)
    except (requests.RequestException, ValueError, TypeError) as exc:
        logger.info("asking %s for a key failed: %s", holder, exc)
        _mark_down(ctx.memory.sealed, holder, now)
    return None


def _ask_peer(peers: PeerAccess, holder: str, job_id: int, round_: int, trainer: str) -> str:
    """POST a key request signed by this node (``peers``) to ``holder``'s endpoint; the hex key, or
    an exception."""
    base = peers.endpoint(holder)
    body = json.dumps({"job": job_id, "round": round_, "trainer": trainer}).encode()
    headers = peers.signed_headers(base, KEY_PATH, body, receiver=holder)
    headers["Content-Type"] = "application/json"
    with requests.post(
        base + KEY_PATH,
        data=body,
        headers=headers,
        timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
        allow_redirects=False,
        stream=True,
    ) as response:
        raw = response.raw.read(MAX_ANSWER_BYTES + 1, decode_content=False)
        if len(raw) > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer larger than {MAX_ANSWER_BYTES} bytes")
        detail = json.loads(raw or b"{}")
        if response.status_code != 200:
            raise KeyRefused(response.status_code, str(detail.get("detail", ""))[:200])
        key = detail.get("key")
        if not isinstance(key, str):
            raise ValueError("an answer without a key")
        return key


def keys_held(node: str, job_id: int, round_: int) -> set[str]:
    """Trainers (lower-case) whose update keys ``node`` holds for the round."""
    return {
        t.lower()
        for t in UpdateKey.objects.filter(node=node, job_id=job_id, round=round_).values_list(
            "trainer", flat=True
        )
    }
