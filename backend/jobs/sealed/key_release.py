"""A holder's side of a key request: whether the round's training is over (so its keys may go
out), and the one decision behind the peer endpoint, ``answer``.

Keys are served to the job's participants only, over a node-signed peer request
(``backend.peers.guard.peer_signed``: signature, freshness, receiver, registry membership,
replay and rate), only once the training is over by the chain's clock (the round left training,
its update deadline passed, or every trainer's update is in), and only for an update on chain
with the reference and hash of the key held.
"""

from __future__ import annotations

import json
import logging
import re

from backend.jobs import chain
from backend.jobs.context import NodeContext
from backend.jobs.driver.memory import MAX_OFFERS
from backend.jobs.models import UpdateKey
from backend.jobs.sealed.key_store import same_update
from backend.ledger import models as mirror

logger = logging.getLogger(__name__)

# A key request is a small JSON object, its answer one hex key: anything larger is refused unread.
MAX_REQUEST_BYTES = 512
# Seconds past a time-based update deadline before a key is handed out: the clock skew between
# this node and the chain's block producer that a late submit could otherwise use.
RELEASE_SLACK_S = 1
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_MAX_ID = 2**64 - 1


class KeyRefused(Exception):
    """A key request this node does not answer: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def training_over(on_chain, round_: int, now: int) -> bool:
    """Whether round ``round_``'s keys may be released: by the contract's state and clock ``now``."""
    if on_chain.round > round_:
        return True
    if on_chain.round < round_:
        return False
    if on_chain.status != chain.JobStatus.RUNNING or on_chain.phase != chain.RoundPhase.TRAINING:
        return True
    trainers = on_chain.reveal_count - on_chain.committee_size  # the drawn participants train
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
    the contract's own events, so it can lag the chain but never lead it (its drawn participants
    are every DrawSecretRevealed of the job, all of which precede the JobStarted that opened round
    1, so a mirror that shows a round counts them all; the projection refuses none the contract
    can emit); the deadline by the clock is left to the contract (``_over_on_chain``)."""
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
    trainers = job.participants.filter(drawn=True).count() - job.committee_size
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
    if held is None or not (same_update(held, update) if update is not None else _on_chain(ctx, held)):
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
