"""Load what a job's first round needs while the job is still gathering participants.

Round 1 otherwise pays, on its critical path, for decrypting and splitting this node's
dataset, fetching and decoding the initial model, building the architecture and calibrating
the DP noise (a search over the RDP accountant, above a second on a small CPU). All of it
lands in per-process caches (driver.workspace, fl_node.privacy's calibration cache), so
the actions that run in this process (the agent's, without a broker) start warm.
"""

from __future__ import annotations

import logging

from backend.jobs.driver import state, workspace
from backend.ledger import models as mirror

logger = logging.getLogger(__name__)
_warmed: set[tuple[str, int]] = set()  # (node, job id) prepared by this process


def warm_jobs(ctx) -> None:
    """Prepare each open or running job this node takes part in, once per process.

    Only where the actions run in this process: a Celery worker has caches of its own.
    """
    from django.conf import settings

    if not settings.CELERY_TASK_ALWAYS_EAGER:
        return
    active = (mirror.Job.Status.OPEN, mirror.Job.Status.RUNNING)
    jobs = mirror.Job.objects.filter(status__in=active, participants__node=ctx.address).distinct()
    for job in jobs:
        if (ctx.address, job.job_id) in _warmed:
            continue
        _warmed.add((ctx.address, job.job_id))  # one try: on failure round 1 loads it itself
        try:
            warm(ctx, job)
        except Exception as exc:
            logger.info("could not prepare job %s ahead of its first round: %s", job.job_id, exc)


def warm(ctx, job: mirror.Job) -> None:
    from backend.jobs.services import config_of, job_record
    from fl_node.train import plan_round

    config = config_of(job_record(ctx, job.job_id))
    train, _ = workspace.local_split(state.my_dataset(job, ctx.address), config)
    workspace.global_model(ctx, job.initial_model_ref, job.initial_model_hash)
    workspace.scratch_model(config)
    train_config = config.train_config(seed=0)  # the calibration does not depend on the seed
    if train_config.private:
        plan_round(len(train), train_config)
    config.update_mechanism()
