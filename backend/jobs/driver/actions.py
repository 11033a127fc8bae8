"""Claiming and running one action: a DB row per (node, job, round, kind) is the claim.

The agent ``offer``s a due action (creates or re-queues its row, then dispatches it); the
worker ``run``s it only if it wins the queued -> running transition, so two workers never
do the same action, and a done action is never run again.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import IntegrityError, OperationalError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from backend.datasets.budget import settle_closed
from backend.jobs.context import NodeContext
from backend.jobs.discovery import config_of, job_record
from backend.jobs.driver import aggregator, committee, draw, registrar, state, timing, trainer
from backend.jobs.driver.planner import Due
from backend.jobs.driver.state import ActionError, Outcome
from backend.jobs.models import RoundAction
from backend.ledger import models as mirror
from backend.telemetry.logs import action_context

logger = logging.getLogger(__name__)
State = RoundAction.State
Kind = RoundAction.Kind
# "Not yet" actions (waiting for a turn, the mirror, more updates to score) are offered again at
# the next tick where the planner still finds them due, unless they named a later time (recheck_s).
# Ticks come with new blocks (or every DEFL_AGENT_INTERVAL), so this is no busy loop; any delay
# here would make the action miss the block it waits for and sleep until the next interval.
WAITING_RECHECK_S = 0.0
FINISH_RETRY_S = 120.0  # how long an action's outcome waits for the database to record it


def offer(ctx: NodeContext, due: Due) -> bool:
    """Queue ``due`` unless it is done, queued or running (and alive), or failed too recently."""
    now = timezone.now()
    try:
        with transaction.atomic():
            claim, created = RoundAction.objects.get_or_create(
                node=ctx.address, job_id=due.job_id, round=due.round, kind=due.kind
            )
    except IntegrityError:  # another agent of this node created it at the same moment
        return False
    if created:
        return True
    age = (now - claim.updated).total_seconds()
    if claim.state == State.DONE:
        return False
    if claim.state in (State.QUEUED, State.RUNNING) and age < ctx.action_lease_s:
        return False
    if claim.state == State.WAITING and age < (claim.recheck_s or WAITING_RECHECK_S):
        return False
    if claim.state == State.FAILED and age < ctx.retry_after_s * min(max(claim.attempts, 1), 12):
        return False
    # Conditional update: of two agents re-queuing the same stale row, one wins.
    return bool(
        RoundAction.objects.filter(pk=claim.pk, state=claim.state, updated=claim.updated).update(
            state=State.QUEUED, updated=now
        )
    )


def run_now(ctx: NodeContext, due: Due) -> Outcome | None:
    """Claim ``due`` and run it on the caller's thread at once (an API request's own step: the
    proposer's reveal right after its start). The claim is the agent's: whichever of the two
    offers it first sends its transaction, and the other sends nothing. None when the agent has
    it (queued, running or done) already."""
    if not offer(ctx, due):
        return None
    return run(ctx, due)


def _begin(ctx: NodeContext, due: Due) -> RoundAction | None:
    stale = timezone.now() - timedelta(seconds=ctx.action_lease_s)
    claim = RoundAction.objects.filter(
        node=ctx.address, job_id=due.job_id, round=due.round, kind=due.kind
    ).first()
    if claim is None:
        return None
    taken = (
        RoundAction.objects.filter(pk=claim.pk)
        .filter(state=State.QUEUED)
        .update(state=State.RUNNING, attempts=F("attempts") + 1, updated=timezone.now())
    )
    if not taken and claim.state == State.RUNNING and claim.updated < stale:
        taken = RoundAction.objects.filter(pk=claim.pk, updated=claim.updated).update(
            attempts=F("attempts") + 1, updated=timezone.now()
        )
    if not taken:
        return None
    claim.refresh_from_db()
    return claim


def run(ctx: NodeContext, due: Due) -> Outcome | None:
    """Run a claimed action; None when another worker has it or it is done."""
    # Every log line of the action, down to the ledger and the swarm store, names its job, round
    # and kind (backend/telemetry/logs.py); the cluster runner carries them onto the training thread.
    with action_context(job=due.job_id, round=due.round, action=due.kind):
        return _run(ctx, due)


def _run(ctx: NodeContext, due: Due) -> Outcome | None:
    claim = _begin(ctx, due)
    if claim is None:
        return None
    if due.kind in (Kind.REGISTER, Kind.MEASURE):
        # Off the round's critical path, and due on every node for every fixed model: a node
        # that came back after missing rounds settles what it left reserved in them here.
        settle_closed_releases(ctx, due.job_id)
    claim.started_at = time.time()  # wall clock: the benchmarks line actions of several nodes up
    started = time.perf_counter()
    with timing.collect() as parts:
        try:
            outcome = _perform(ctx, due, claim)
        except ActionError as exc:
            outcome = Outcome(False, str(exc))
        except Exception as exc:
            logger.exception("%s of job %s round %s failed", due.kind, due.job_id, due.round)
            # The database server may have closed the connection (restarted): recording the
            # failure on a new one lets the action be retried, instead of its claim staying
            # "running" until its lease expires.
            if not connection.in_atomic_block:  # closing inside a transaction would abort it
                close_old_connections()
            _finish(claim, State.FAILED, f"{type(exc).__name__}: {exc}", started, parts)
            return Outcome(False, str(exc))
    _finish(claim, State.DONE if outcome.done else State.WAITING, outcome.detail, started, parts, outcome)
    return outcome


def _finish(
    claim: RoundAction,
    state: str,
    detail: str,
    started: float,
    parts: dict[str, float],
    outcome: Outcome | None = None,
):
    claim.state = state
    claim.detail = detail[:2000]
    claim.seconds = time.perf_counter() - started
    claim.parts = {name: round(seconds, 6) for name, seconds in parts.items()}
    claim.recheck_s = None
    if outcome is not None:
        claim.tx_hash = outcome.tx_hash or claim.tx_hash
        claim.work_seconds = outcome.work_seconds
        claim.recheck_s = outcome.recheck_s
    fields = ["state", "detail", "seconds", "tx_hash", "work_seconds", "parts", "started_at", "updated"]
    fields.append("recheck_s")
    # The outcome must reach the claim: unrecorded, a done action (its transaction sent) or a
    # failed one would stay "running" until its lease expires. A database server restarting
    # refuses connections for seconds: wait for it (on a new connection each try).
    deadline = time.monotonic() + FINISH_RETRY_S
    while True:
        try:
            claim.save(update_fields=fields)
            return
        except OperationalError:
            server_away = connection.connection is None or not connection.is_usable()
            if not server_away or connection.in_atomic_block or time.monotonic() > deadline:
                raise  # an error about the row itself, or the server stays away
            logger.warning(
                "cannot record %s of job %s round %s yet: the database is away",
                claim.kind,
                claim.job_id,
                claim.round,
            )
            time.sleep(1.0)
            close_old_connections()


def _perform(ctx: NodeContext, due: Due, claim: RoundAction) -> Outcome:
    with timing.part(timing.PREPARE):
        job = mirror.Job.objects.get(job_id=due.job_id)
        config = config_of(job_record(ctx, due.job_id))
    if due.kind == Kind.TRAIN:
        return trainer.train_round(ctx, job, config, due.round, claim)
    if due.kind == Kind.SCORE:
        return committee.score_round(ctx, job, config, due.round, claim)
    if due.kind == Kind.FINALIZE:
        return committee.finalize_round(ctx, job, due.round, claim.created.timestamp())
    if due.kind == Kind.AGGREGATE:
        return aggregator.vote(ctx, job, config, due.round, claim.created.timestamp())
    if due.kind == Kind.REVEAL:
        return draw.reveal(ctx, job)
    if due.kind == Kind.DRAW:
        return draw.draw(ctx, job, claim.created.timestamp())
    if due.kind == Kind.REGISTER:
        return registrar.register_round(ctx, job, config, due.round)
    if due.kind == Kind.MEASURE:
        return registrar.measure_round(ctx, job, config, due.round)
    raise ValueError(f"unknown action {due.kind!r}")


def release_lost_claims(ctx: NodeContext) -> int:
    """At the start of a node whose actions run in its own process: nothing can still be running."""
    lost = release_orphaned_claims(ctx, set())
    for job_id in mirror.Job.objects.filter(participants__node=ctx.address).values_list("job_id", flat=True):
        settle_closed_releases(ctx, job_id)
    return lost


def release_orphaned_claims(ctx: NodeContext, in_process: set[Due], older_than_s: float = 0.0) -> int:
    """Queued or running claims this process no longer runs, back to waiting, so the next tick
    offers them at once. Called between ticks, when no action runs on the agent's thread.

    Only for a node whose actions all run in this process (no broker): there, an action runs on
    the agent's thread within the tick that offered it, or on the background thread, whose
    actions are ``in_process``; any other open claim is orphaned. One is left when the database
    recorded a claim but the process never ran it to the end: an offer whose commit reached the
    server while its reply was lost, a background action that gave up waiting for the database,
    an outcome that could not be recorded. Left alone, each would wait out its lease
    (ctx.action_lease_s, 600 s) while its round's deadline passed. ``older_than_s``: only claims
    not touched for that long (the periodic sweep's margin).
    """
    orphans = RoundAction.objects.filter(node=ctx.address, state__in=(State.QUEUED, State.RUNNING))
    if older_than_s > 0:
        orphans = orphans.filter(updated__lt=timezone.now() - timedelta(seconds=older_than_s))
    for due in in_process:  # a handful at most: the background thread's queue
        orphans = orphans.exclude(job_id=due.job_id, round=due.round, kind=str(due.kind))
    # One UPDATE: a claim its action takes meanwhile (queued -> running) is still matched, but
    # only claims this process holds can change between ticks, and those are excluded.
    released = orphans.update(state=State.WAITING, recheck_s=None, updated=timezone.now())
    if released:
        logger.warning("%d claim(s) this process no longer runs: offered again", released)
    return released


def settle_closed_releases(ctx: NodeContext, job_id: int) -> None:
    """Settle this node's privacy reservations in the job's rounds that the chain has closed.

    A release is reserved before it is computed and settled by the action that publishes (or
    discards) it; one killed in between (SIGKILL, power loss) leaves its reservation open, and
    when its round closes without it no attempt ever comes back to settle it: the job's privacy
    would never be final. Released where the chain shows the output, withheld otherwise; both
    stay counted (budget.settle_closed). Never fails the action that calls it.
    """
    try:
        job = mirror.Job.objects.get(job_id=job_id)
        dataset = state.my_dataset(job, ctx.address)
        before = state.first_open_round(job)
        if before <= 1:
            return
        for _ in range(64):  # budget.MAX_ABANDONED rows a call; a bound on a node's own rows
            released, withheld = settle_closed(
                dataset, job_id, before, lambda r, kind: state.published(job, ctx.address, r, kind)
            )
            if released or withheld:
                logger.info(
                    "job %s: settled %d release(s) left reserved in closed rounds as released, %d withheld",
                    job_id,
                    released,
                    withheld,
                )
            if released + withheld == 0:
                return
    except (ActionError, mirror.Job.DoesNotExist):
        return
    except Exception:  # the database briefly away: the next action or restart settles them
        logger.exception("settling the closed rounds' releases of job %s failed", job_id)
