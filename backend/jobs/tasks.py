"""Celery tasks of the round driver. Eager (in-process) without a broker; a worker on Redis with one."""

from __future__ import annotations

import logging
import time

from celery import bootsteps, shared_task
from celery.signals import worker_ready
from celery.utils.nodenames import worker_direct
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from backend.celery import app
from backend.cluster import priority, registry
from backend.cluster import runner as cluster_runner
from backend.jobs.context import current_node
from backend.jobs.driver import actions, warmup
from backend.jobs.driver.planner import Due
from backend.jobs.models import RoundAction

logger = logging.getLogger(__name__)
REGISTER_NICE = 19  # as nice as Linux allows: a round's metrics can wait, its training cannot
BACKGROUND = (RoundAction.Kind.REGISTER, RoundAction.Kind.MEASURE)


@shared_task(name="jobs.run_action", ignore_result=True)
def run_action(job_id: int, round_: int, kind: str) -> str:
    due, ctx = Due(job_id, round_, kind), current_node()
    if kind == RoundAction.Kind.TRAIN and _closed_training(ctx, due):
        return "skipped"
    outcome = actions.run(ctx, due)
    if outcome is None and kind == RoundAction.Kind.TRAIN:
        # Not this worker's to run (another has it, or it is done): give back the share of a
        # slot it was routed with, so the slot does not look busy for nothing.
        task = cluster_runner.enqueue(job_id, round_, node=ctx.address)
        if task.state == task.State.QUEUED:
            cluster_runner.placement.release(task)
    return "skipped" if outcome is None else outcome.detail


@shared_task(name=warmup.WARM_JOB_TASK, ignore_result=True)
def warm_job(job_id: int) -> bool:
    """Load a job's first round into this worker's caches (driver.warmup) and mark it prepared."""
    return warmup.warm_and_mark(current_node(), job_id)


def dispatch(due: Due) -> None:
    if due.kind in BACKGROUND and settings.CELERY_TASK_ALWAYS_EAGER:
        # Serving and measuring a fixed model is on no round's critical path. Run inline it
        # would hold the agent (a trainer serves as its own training ends, just when the
        # round's last update is being scored); beside it, nicer than training too, it takes
        # the CPU that training and the round's next steps leave, and delays none of them (the
        # planner keeps measuring out of a committee member's process while it scores).
        ctx = current_node()
        ctx.memory.agent.in_process.add(due)  # not an orphan while it waits here (release_orphans)
        priority.low_priority("register", REGISTER_NICE).submit(_run_in_background, ctx, due)
        return
    try:
        if due.kind == RoundAction.Kind.TRAIN:
            _dispatch_training(current_node(), due)
            return
        run_action.delay(due.job_id, due.round, due.kind)
    except Exception as exc:
        if settings.CELERY_TASK_ALWAYS_EAGER:  # it ran here and failed: not a broker's error
            requeue_when_back(current_node(), due)
            raise
        # The broker is away (restarting): the next tick sends it again.
        logger.warning(
            "cannot send %s of job %s round %s to the worker: %s", due.kind, due.job_id, due.round, exc
        )
        requeue_unsent(current_node(), [due], f"not sent to the worker (broker unreachable): {exc}")


def _dispatch_training(ctx, due: Due) -> None:
    """A round's local training is a cluster task: queued with its job's priority and, with a
    broker, placed on the live worker with the most free capacity and sent to that worker."""
    task = cluster_runner.enqueue(due.job_id, due.round, node=ctx.address)
    if _closed_training(ctx, due):
        return
    worker = None if settings.CELERY_TASK_ALWAYS_EAGER else cluster_runner.route(task)
    try:
        if worker is not None and worker.queue:
            run_action.apply_async((due.job_id, due.round, due.kind), queue=worker_direct(worker.queue))
        else:
            run_action.delay(due.job_id, due.round, due.kind)
    except Exception:
        cluster_runner.placement.release(task)  # the share it was routed with: no task holds it
        raise


def _closed_training(ctx, due: Due) -> bool:
    """An operator cancelled the round's training, or it ran out of attempts: the action ends
    here, before anything is reserved or computed (the node sends no update for that round)."""
    task = cluster_runner.closed(due.job_id, due.round, node=ctx.address)
    if task is None:
        return False
    why = "cancelled by the operator" if task.state == task.State.CANCELLED else f"failed: {task.error}"
    RoundAction.objects.filter(node=ctx.address, job_id=due.job_id, round=due.round, kind=due.kind).update(
        state=RoundAction.State.DONE, detail=f"local training task {task.pk} {why}"[:2000]
    )
    return True


def _run_in_background(ctx, due: Due) -> None:
    try:
        # The thread's connection may have been closed by the server since its last action
        # (restarted): checked before use (CONN_HEALTH_CHECKS), not failed on.
        close_old_connections()
        actions.run(ctx, due)
    except Exception:  # actions.run records its own failures; this is the database going away
        logger.exception("%s of job %s round %s failed", due.kind, due.job_id, due.round)
        requeue_when_back(ctx, due)
    finally:
        ctx.memory.agent.in_process.discard(due)
        close_old_connections()


ORPHAN_AGE_S = 60.0  # the periodic sweep's margin: a claim untouched this long


def release_orphans(ctx, after_failure: bool) -> int:
    """For an agent that runs its actions in-process: the claims this process holds no more are
    offered again (actions.release_orphaned_claims). After a tick its database failed, at once;
    otherwise (the periodic sweep, for a loss no tick saw) those untouched for ORPHAN_AGE_S."""
    older_than = 0.0 if after_failure else ORPHAN_AGE_S
    return actions.release_orphaned_claims(ctx, set(ctx.memory.agent.in_process), older_than)


def requeue_when_back(ctx, due: Due) -> None:
    """A claim queued for this process that could not begin (its database went away): back to
    waiting once the database answers, so the next tick offers it again, not its lease (600 s)
    later. A claim that began is not touched: actions.run records its own end."""
    deadline = time.monotonic() + actions.FINISH_RETRY_S
    while True:
        close_old_connections()
        try:
            requeue_unsent(ctx, [due], "its database went away before it began")
            return
        except DatabaseError:
            if time.monotonic() > deadline:
                logger.warning(
                    "%s of job %s round %s stays queued until its lease", due.kind, due.job_id, due.round
                )
                return
            time.sleep(1)


@worker_ready.connect
def _release_lost_claims(sender=None, **_kwargs) -> None:
    """The node's only worker (re)started: whatever it was running is lost, release it now.

    With other live workers (backend.cluster) their running actions are theirs: nothing is
    released here, and an action lost with a crashed worker is taken again once its lease expires.
    """
    others = registry.live_workers().exclude(name=getattr(sender, "hostname", "")).exclude(queue="")
    if others.exists():
        logger.info("other workers are live: their running actions are kept")
        return
    actions.release_lost_claims(current_node())


# ------------------------------------------------------------------ the broker restarted


def requeue_unsent(ctx, dues, why: str) -> int:
    """Queued claims whose message never reached a worker (not sent, or lost with the broker):
    back to waiting, so the agent's next tick offers and sends them again.

    Safe even if a message did survive: a worker runs an action only by winning its claim's
    queued -> running transition, so a message that finds the claim waiting is skipped, and the
    claim runs once, from the message sent next.
    """
    changed = 0
    for due in dues:
        changed += RoundAction.objects.filter(
            node=ctx.address,
            job_id=due.job_id,
            round=due.round,
            kind=due.kind,
            state=RoundAction.State.QUEUED,
        ).update(state=RoundAction.State.WAITING, detail=why[:2000], recheck_s=None, updated=timezone.now())
    return changed


def requeue_lost_messages(ctx) -> int:
    """After the worker lost its broker connection: the messages queued meanwhile may be gone
    (a broker restarted without persistence keeps none), so every queued claim of this node is
    sent again. Running claims are this worker's own (it kept running them) or another's."""
    queued = RoundAction.objects.filter(node=ctx.address, state=RoundAction.State.QUEUED)
    dues = [Due(a.job_id, a.round, a.kind) for a in queued.only("job_id", "round", "kind")[:10_000]]
    changed = requeue_unsent(ctx, dues, "sent again: the worker lost its broker connection")
    if changed:
        logger.warning("broker connection restored: %d queued action(s) will be sent again", changed)
    return changed


class RequeueAfterReconnect(bootsteps.StartStopStep):
    """A consumer step: it starts with every connection the worker makes to the broker, the
    first and each one after a loss; after a loss, the queued actions are sent again."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c) -> None:
        if getattr(c, "restart_count", 0) < 1:  # the first connection: nothing was lost
            return
        try:
            requeue_lost_messages(current_node())
        except Exception:  # the database may be away too: the actions' leases still recover them
            logger.exception("could not re-send the queued actions after the broker came back")
        finally:
            close_old_connections()


app.steps["consumer"].add(RequeueAfterReconnect)
