"""Fetch the round's updates as they are submitted, ahead of the actions that will read them.

When a round is finalized, every trainer of the next round aggregates it (speculative
training, see trainer.py) and the new committee aggregates it too: fetching the accepted
updates then would sit on the round's critical path. Each update is on chain, and in the
swarm, from the moment its trainer submits it, while the round's last trainers still train;
fetching it then, on a thread of its own, takes the fetch off the path. The committee of the
round is left out: its score action fetches each update as it arrives.
"""

from __future__ import annotations

import threading

from django.conf import settings
from django.db import close_old_connections
from django.db.models import F

from backend.jobs import blobs
from backend.jobs.driver import priority
from backend.ledger import models as mirror

_pending: set[str] = set()
_lock = threading.Lock()


def round_updates(ctx) -> int:
    """Start fetching the current rounds' updates this node has not got; returns how many.

    Only where the actions run in this process: the cache is per process, and a Celery worker
    has its own (it fetches when its action runs).
    """
    if not settings.CELERY_TASK_ALWAYS_EAGER:
        return 0
    rows = list(
        mirror.Update.objects.filter(
            job__status=mirror.Job.Status.RUNNING,
            job__participants__node=ctx.address,
            job__current_round=F("round"),
        )
        .exclude(trainer=ctx.address)
        .values_list("job_id", "round", "reference")
    )
    if not rows:
        return 0
    scoring = set(
        mirror.CommitteeSeat.objects.filter(member=ctx.address, job_id__in={r[0] for r in rows}).values_list(
            "job_id", "round"
        )
    )
    started = 0
    for job_id, round_, reference in rows:
        if (job_id, round_) in scoring or blobs.cached(reference):
            continue
        with _lock:
            if reference in _pending:
                continue
            _pending.add(reference)
        priority.low_priority("prefetch", 0).submit(_fetch, ctx, reference)
        started += 1
    return started


def _fetch(ctx, reference: str) -> None:
    try:
        blobs.prefetch(ctx, reference)
    finally:
        with _lock:
            _pending.discard(reference)
        close_old_connections()
