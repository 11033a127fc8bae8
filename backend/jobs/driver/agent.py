"""The agent loop (``manage.py node run``): index the chain, plan this node's actions, dispatch them.

Each tick is cheap when nothing is due: one log query to the chain and a few indexed
queries. With no broker the actions run inline, one after another, in this process;
with CELERY_BROKER_URL they go to the node's Celery worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from backend.jobs import chain
from backend.jobs.driver import actions, planner
from backend.jobs.driver.planner import Due
from backend.jobs.models import JobRecord
from backend.ledger import models as mirror

logger = logging.getLogger(__name__)
_discovery_attempts: dict[int, float] = {}
DISCOVERY_RETRY_S = 10.0


def tick(ctx, dispatch: Callable[[Due], None]) -> list[Due]:
    """One pass: returns the actions dispatched."""
    chain.sync_mirror(ctx)
    discover_configs(ctx)
    offered = []
    for due in planner.due_actions(ctx.address, chain.chain_time(ctx)):
        if actions.offer(ctx, due):
            offered.append(due)
            dispatch(due)
    return offered


def discover_configs(ctx) -> None:
    """Fetch the configuration of every open or running job this node has not seen yet."""
    from backend.jobs.services import discover

    known = set(JobRecord.objects.values_list("onchain_id", flat=True))
    active = (mirror.Job.Status.OPEN, mirror.Job.Status.RUNNING)
    for job in mirror.Job.objects.filter(status__in=active).exclude(job_id__in=known):
        if time.monotonic() - _discovery_attempts.get(job.job_id, -1e9) < DISCOVERY_RETRY_S:
            continue
        _discovery_attempts[job.job_id] = time.monotonic()
        try:
            discover(ctx, job)
        except Exception as exc:  # not replicated to us yet, or unusable: retried later
            logger.warning("cannot fetch the configuration of job %s: %s", job.job_id, exc)


def run_forever(
    ctx,
    dispatch: Callable[[Due], None],
    *,
    interval: float,
    stop: threading.Event | None = None,
    on_tick: Callable[[list[Due]], None] | None = None,
) -> None:
    stop = stop or threading.Event()
    while not stop.is_set():
        started = time.monotonic()
        try:
            offered = tick(ctx, dispatch)
            if on_tick:
                on_tick(offered)
        except Exception:  # the chain or the database is briefly away: keep the node alive
            logger.exception("agent tick failed")
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
