"""The agent loop (``manage.py node run``): index the chain, plan this node's actions, dispatch them.

Each tick is cheap when nothing is due: one log query to the chain and a few indexed
queries. With no broker the actions run inline, one after another, in this process (but
registering a fixed model, which runs beside them, see tasks.dispatch); with
CELERY_BROKER_URL they go to the node's Celery worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import close_old_connections, connection

from backend.datasets import services
from backend.jobs import chain
from backend.jobs.context import NodeContext
from backend.jobs.discovery import discover
from backend.jobs.driver import actions, planner, prefetch, reconcile, warmup
from backend.jobs.driver.planner import Due
from backend.jobs.models import JobRecord
from backend.jobs.remote_config import RemoteConfigRejected
from backend.ledger import models as mirror
from backend.ledger.heads import Head, HeadWatcher
from backend.ledger.models import ChainEvent
from backend.swarm.errors import BlobTooLarge, InvalidTree

logger = logging.getLogger(__name__)
DISCOVERY_RETRY_S = 10.0
JOBS_CONTRACT = "FederatedLearning"  # the contract whose events move rounds (ChainEvent.contract)
LIFECYCLE_EVENTS = {
    "JobProposed",
    "ParticipantJoined",
    "JobStarted",
    "JobFinished",
    "JobFailed",
    "JobCancelled",
}


# How often an agent with a ``recover`` step runs it without a failed tick (a sweep for claims
# left open by a loss no tick saw; see tasks.release_orphans).
RECOVER_EVERY_S = 30.0


class PlanGate:
    """Whether a tick needs to plan: only the jobs contract's events (or time) change what is due.

    Each trainer's spendPrivacy is a block of its own, and every node wakes for every block;
    planning for one that holds only dataset or node events finds nothing new, at the cost of
    the planner's queries on every node, while the trainers train. Events are counted by row,
    whichever process of the node indexed them (the API indexes too).

    ``lifecycle``: the last ``should_plan`` saw a job proposed, joined, started or ended (or the
    interval passed): only then can a job need discovering or preparing.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.seen = 0  # the newest ChainEvent row planned for
        self.planned_at = float("-inf")
        self.lifecycle = True

    def should_plan(self) -> bool:
        new = list(ChainEvent.objects.filter(id__gt=self.seen).values_list("id", "contract", "name"))
        self.seen = max((row_id for row_id, _, _ in new), default=self.seen)
        relevant = [name for _, contract, name in new if contract == JOBS_CONTRACT]
        interval_passed = time.monotonic() - self.planned_at >= self.interval
        self.lifecycle = interval_passed or any(name in LIFECYCLE_EVENTS for name in relevant)
        if relevant or interval_passed:
            self.planned_at = time.monotonic()
            return True
        return False


def tick(
    ctx: NodeContext, dispatch: Callable[[Due], None], head: Head | None = None, gate: PlanGate | None = None
) -> list[Due]:
    """One pass: returns the actions dispatched. ``head``: the chain's latest block, when known."""
    chain.sync_mirror(ctx, head.number if head else None)
    if gate is not None and not gate.should_plan():
        return []
    if gate is None or gate.lifecycle:
        discover_configs(ctx)
        # spends the chain holds and this node's database lost (a restore from an older backup)
        reconcile.reconcile_releases(ctx)
        regrant_after_upgrade(ctx)
        services.rotate_due_keys()  # a revocation whose data key rotation did not finish
        warmup.warm_jobs(ctx)
    offered = []
    now = chain.chain_time(ctx, head.timestamp if head else None)
    prefetch.round_updates(ctx)
    for due in planner.due_actions(ctx.address, now, speculate=ctx.speculative_training):
        if actions.offer(ctx, due):
            offered.append(due)
            dispatch(due)
    return offered


# The DataRegistry addresses whose carried grants this process issued again (once each).
_REGRANTED: set[str] = set()


def regrant_after_upgrade(ctx: NodeContext) -> None:
    """On contracts that carried the consortium over (docs/OPERATIONS.md, Upgrades), once their
    import closed: this node's grants issued again (version 1 kept wrapped keys only in events)."""
    deployment = ctx.ledger.deployment
    data = deployment.addresses.get("DataRegistry", "")
    if deployment.previous is None or data in _REGRANTED:
        return
    granted = services.regrant_carried()
    if granted is not None:
        _REGRANTED.add(data)
        if granted:
            logger.warning("granted %d dataset(s) again on the upgraded contracts", granted)


def discover_configs(ctx: NodeContext) -> None:
    """Fetch the configuration of every open or running job this node has not seen yet."""
    active = (mirror.Job.Status.OPEN, mirror.Job.Status.RUNNING)
    known = JobRecord.objects.values("onchain_id")  # a subquery: one query a tick, not two
    memory = ctx.memory.agent
    for job in mirror.Job.objects.filter(status__in=active).exclude(job_id__in=known):
        if job.job_id in memory.declined:
            continue
        if time.monotonic() - memory.discovery_attempts.get(job.job_id, -1e9) < DISCOVERY_RETRY_S:
            continue
        memory.discovery_attempts[job.job_id] = time.monotonic()
        try:
            discover(ctx, job)
        except RemoteConfigRejected as exc:  # the same config gives the same verdict: not retried
            memory.declined[job.job_id] = exc.reason
            logger.warning("%s", exc)
        except (BlobTooLarge, InvalidTree) as exc:
            # A reference names immutable bytes: a tree past the config bound (a span bomb) or
            # malformed stays so. Declined for good, not fetched again every retry.
            memory.declined[job.job_id] = f"the configuration reference is unusable: {exc}"
            logger.warning("declining job %s: %s", job.job_id, memory.declined[job.job_id])
        except Exception as exc:  # not replicated to us yet, or unusable: retried later
            logger.warning("cannot fetch the configuration of job %s: %s", job.job_id, exc)


def run_forever(
    ctx: NodeContext,
    dispatch: Callable[[Due], None],
    *,
    interval: float,
    poll: float | None = None,
    stop: threading.Event | None = None,
    on_tick: Callable[[list[Due]], None] | None = None,
    subscribe: bool = True,
    recover: Callable[[bool], object] | None = None,
) -> None:
    """Tick whenever the chain has a new block, and at least every ``interval`` s.

    A round moves only through transactions, so a new block is when an action may have become
    due: reacting to it at once instead of at the next full tick removes most of the wait
    between one node's step and the next node's. The ledger's HeadWatcher says when: a
    newHeads subscription where the chain serves one (no request while idle), else one
    eth_blockNumber per ``poll``; a subscription's header also gives the tick the head's
    number and timestamp, which it would otherwise ask for. The full tick (indexer, planner)
    runs on a new block, or for deadlines that pass without one, every ``interval``. A tick
    that ran an action in-process sent a transaction, so the next wait returns at once and
    ticks again.
    """
    stop = stop or threading.Event()
    poll = interval if poll is None else max(0.005, min(poll, interval))
    heads = HeadWatcher(ctx.ledger.client, poll=poll, subscribe=subscribe)
    gate = PlanGate(interval)
    last_tick = float("-inf")
    failed = False  # the last tick failed: ``recover(True)`` runs before the next one
    swept = time.monotonic()  # ``recover(False)`` runs every RECOVER_EVERY_S too
    try:
        while not stop.is_set():
            due_in = last_tick + interval - time.monotonic()
            if due_in > 0 and not heads.wait(min(due_in, 1.0)):
                continue  # no new block yet; the stop flag is checked at least every second
            last_tick = time.monotonic()
            try:
                # A tick is this process's unit of work, as a request is the web server's: drop a
                # connection the database server closed (restarted), ping the others before use.
                if not connection.in_atomic_block:
                    close_old_connections()
                if recover is not None and (failed or time.monotonic() - swept >= RECOVER_EVERY_S):
                    recover(failed)  # raises while the database is still away: tried again next time
                    swept = time.monotonic()
                failed = False
                offered = tick(ctx, dispatch, heads.latest, gate)
                if on_tick:
                    on_tick(offered)
            except Exception:  # the chain or the database is briefly away: keep the node alive
                logger.exception("agent tick failed")
                failed = True
                stop.wait(interval)
    finally:
        heads.close()
