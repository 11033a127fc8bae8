"""A round's keys asked for all at once, one thread per update (``gather_keys``), or ahead of the
score action (``ask_ahead``). The answers are OFFERED, unchecked, to the reader
(backend.jobs.sealed.reader), which checks a key on the blob it reads anyway before keeping it.
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from django.db import close_old_connections

from backend.jobs.context import NodeContext
from backend.jobs.driver import timing
from backend.jobs.driver.memory import MAX_OFFERS, SealedMemory
from backend.jobs.models import UpdateKey
from backend.jobs.sealed import key_requests
from backend.jobs.sealed.envelope import KEY_BYTES
from backend.jobs.sealed.key_store import same_update

logger = logging.getLogger(__name__)

# Keys of one round asked for at the same time (gather_keys): one thread per update, at most this many.
KEY_THREADS = 16
# The threads that ask for a round's keys (gather_keys) are the process's, not a node's: they
# keep nothing between requests (each call hands its node's memory to its own), as the cluster's
# thread pools (backend.cluster.priority) do; a restart (``memory.clear()``) has nothing to forget there.
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


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
        done, late = wait(asks, timeout=key_requests.CONNECT_TIMEOUT_S + key_requests.READ_TIMEOUT_S)
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
        if (row is not None and same_update(row, update)) or _offer_of(ctx, job_id, round_, update):
            continue
        offer = _offer_key(job_id, round_, update)
        with memory.lock:
            future = memory.asking.get(offer)
        if future is None:
            if participants is None:
                participants = key_requests.job_participants(job_id)
                in_database = set(
                    UpdateKey.objects.filter(node__in=participants).values_list("node", flat=True).distinct()
                )
            asked = key_requests.holders(ctx, job_id, update.trainer, participants)
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


def take_offer(ctx: NodeContext, job_id: int, round_: int, update) -> bytes | None:
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
            (
                key
                for _, key in key_requests.answers(ctx, holders, job_id, round_, trainer)
                if len(key) == KEY_BYTES
            ),
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
