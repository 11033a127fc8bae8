"""Fetch the round's updates as they are submitted, ahead of the actions that will read them.

When a round is finalized, every trainer of the next round aggregates it (speculative
training, see trainer.py) and the new committee aggregates it too: fetching the accepted
updates then would sit on the round's critical path. Each update is on chain, and in the
swarm, from the moment its trainer submits it, while the round's last trainers still train;
fetching it then, on a thread of its own, takes the fetch off the path. The committee of the
round fetches each update the same way, on a thread at full priority: the round's last update
is then on its way while the agent plans and begins the score action, whose read waits for
that fetch (backend.jobs.blobs reads a blob once at a time). Once the training is over, the
committee's agent also asks for all the keys at once.

Updates are sealed (backend.jobs.sealed): what is fetched early is the sealed blob. Once the
mirror shows the round's training over (every update in, or its update deadline passed), the
keys are fetched too, on the same threads, while the committee scores: the next committee and
the next round's speculating trainers then aggregate without asking anyone.
"""

from __future__ import annotations

import logging
import time

from django.db import close_old_connections
from django.db.models import F

from backend.cluster import priority
from backend.jobs import blobs
from backend.jobs.context import NodeContext
from backend.jobs.sealed import key_gathering, key_requests, key_store, reader
from backend.ledger import models as mirror

# What is in flight, the keys asked for lately and the keys the threads found are the node's:
# ``ctx.memory.prefetch`` (backend.jobs.driver.memory), under its lock.
# A key asked for and not got is asked again at most this often (holders not answering yet).
KEY_RETRY_S = 2.0
# The fetching thread's niceness: what it fetches is read only once the round moves on (the next
# aggregate), so it yields the CPU to the work of the moment, the committee's scoring above all
# (on a machine that runs several nodes, or a node's own tick and API).
PREFETCH_NICE = 5


def round_updates(ctx: NodeContext) -> int:
    """Start fetching the current rounds' updates this node has not got; returns how many.

    Only where the actions run in this process: the cache is the node's in this process, and a
    Celery worker has its own (it fetches when its action runs).
    """
    if not ctx.actions_inline:
        return 0
    updates = list(
        mirror.Update.objects.filter(
            job__status=mirror.Job.Status.RUNNING,
            job__participants__node=ctx.address,
            job__current_round=F("round"),
        )
        .exclude(trainer=ctx.address)
        .select_related("job")
    )
    if not updates:
        return 0
    rows = [(u.job_id, u.round, u.reference) for u in updates]
    scoring = set(
        mirror.CommitteeSeat.objects.filter(member=ctx.address, job_id__in={r[0] for r in rows}).values_list(
            "job_id", "round"
        )
    )
    started = 0
    memory = ctx.memory.prefetch
    for job_id, round_, reference in rows:
        if blobs.cached(ctx, reference):
            continue
        with memory.lock:
            if reference in memory.pending:
                continue
            memory.pending.add(reference)
        # The committee scores the update next: the score action waits for this fetch.
        fetching = (
            priority.low_priority("prefetch-score", 0)
            if (job_id, round_) in scoring
            else priority.low_priority("prefetch", PREFETCH_NICE)
        )
        fetching.submit(_fetch, ctx, reference)
        started += 1
    started += _committee_keys(ctx, [u for u in updates if (u.job_id, u.round) in scoring])
    return started + _round_keys(ctx, [u for u in updates if (u.job_id, u.round) not in scoring])


def _committee_keys(ctx: NodeContext, updates: list) -> int:
    """For the rounds this node scores, once the mirror shows the training over: ask for every key
    at once (key_gathering.ask_ahead), so the answers travel while the agent plans and begins the score
    action, which waits on these requests instead of sending its own."""
    by_round: dict[tuple[int, int], list] = {}
    for update in updates:
        by_round.setdefault((update.job.pk, update.round), []).append(update)
    started = 0
    for round_updates in by_round.values():
        job, round_ = round_updates[0].job, round_updates[0].round
        if _training_over(job, round_):
            started += key_gathering.ask_ahead(ctx, job.job_id, round_, round_updates)
    return started


def _round_keys(ctx: NodeContext, updates: list) -> int:
    """Start fetching the keys of ``updates`` whose round's training is over, not held here yet.

    The fetching threads write nothing to the database (an SQLite database serializes writers):
    the keys they found are kept here, on the agent's thread, at the next call.
    """
    memory = ctx.memory.prefetch
    with memory.lock:
        found, memory.found[:] = list(memory.found), []
    for job_id, round_, update, key in found:
        key_store.keep(ctx, job_id, round_, update, key)
    over: dict[tuple[int, int], bool] = {}
    started = 0
    now = time.monotonic()
    for update in updates:
        job, round_ = update.job, update.round
        if (job.pk, round_) not in over:
            over[(job.pk, round_)] = _training_over(job, round_)
        if not over[(job.pk, round_)]:
            continue
        if update.trainer.lower() in key_store.keys_held(ctx.address, job.job_id, round_):
            continue
        tried = (job.job_id, round_, update.trainer.lower())
        with memory.lock:
            if now - memory.key_tries.get(tried, -1e9) < KEY_RETRY_S or ("key", *tried) in memory.pending:
                continue
            if len(memory.key_tries) > 4096:  # bounded: old rounds' entries go
                memory.key_tries.clear()
            memory.key_tries[tried] = now
            memory.pending.add(("key", *tried))
        holders = key_requests.holders(ctx, job.job_id, update.trainer)
        priority.low_priority("prefetch", PREFETCH_NICE).submit(
            _fetch_key, ctx, job.job_id, round_, update, holders
        )
        started += 1
    return started


def _training_over(job: mirror.Job, round_: int) -> bool:
    """The mirror's view: every trainer's update in, or (a job timed in seconds) the deadline passed."""
    trainers = job.participants.filter(drawn=True).count() - job.committee_size
    if job.updates.filter(round=round_).count() >= trainers:
        return True
    if job.use_blocks:
        return False  # the holders decide by the chain; the actions fetch what is missing
    deadline = job.rounds_set.filter(number=round_).values_list("update_deadline", flat=True).first()
    return deadline is not None and time.time() > int(deadline)


def _fetch_key(ctx: NodeContext, job_id: int, round_: int, update, holders: list[str]) -> None:
    memory = ctx.memory.prefetch
    try:
        key = reader.fetch_key(
            ctx,
            holders,
            job_id,
            round_,
            update.trainer,
            update.reference,
            update.content_hash,
            max_bytes=blobs.DEFAULT_MAX_BYTES,
        )
        if key is not None:
            with memory.lock:
                memory.found.append((job_id, round_, update, key))
    except Exception as exc:  # the action's own read asks again, and reports it
        logging.getLogger(__name__).debug("prefetching a key of job %s round %s: %s", job_id, round_, exc)
    finally:
        with memory.lock:
            memory.pending.discard(("key", job_id, round_, update.trainer.lower()))
        close_old_connections()  # the peer directory may have read the mirror


def _fetch(ctx: NodeContext, reference: str) -> None:
    memory = ctx.memory.prefetch
    try:
        blobs.prefetch(ctx, reference)
    finally:
        with memory.lock:
            memory.pending.discard(reference)
        close_old_connections()
