"""Celery tasks of the round driver. Eager (in-process) without a broker; a worker on Redis with one."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready

from backend.jobs.context import current_node
from backend.jobs.driver import actions, warmup
from backend.jobs.driver.planner import Due


@shared_task(name="jobs.run_action", ignore_result=True)
def run_action(job_id: int, round_: int, kind: str) -> str:
    outcome = actions.run(current_node(), Due(job_id, round_, kind))
    return "skipped" if outcome is None else outcome.detail


@shared_task(name="jobs.warm_job", ignore_result=True)
def warm_job(job_id: int) -> bool:
    """Load a job's first round into this worker's caches (driver.warmup) and mark it prepared."""
    return warmup.warm_and_mark(current_node(), job_id)


def dispatch(due: Due) -> None:
    run_action.delay(due.job_id, due.round, due.kind)


@worker_ready.connect
def _release_lost_claims(**_kwargs) -> None:
    """A node runs one worker process: whatever it was running before it (re)started is lost."""
    actions.release_lost_claims(current_node())
