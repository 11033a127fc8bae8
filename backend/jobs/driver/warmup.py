"""Load what a job's first round needs while the job is still gathering participants.

Round 1 otherwise pays, on its critical path, for decrypting and splitting this node's
dataset, fetching and decoding the initial model, building the architecture, calibrating
the DP noise (a search over the RDP accountant, above a second on a small CPU), and the first
training step and update encoding of the process. All of it
lands in per-process caches (driver.workspace, fl_node.privacy's calibration cache), so
the actions that run in this process start warm: the agent's own without a broker; with a
broker the agent asks the node's Celery worker to prepare instead (``jobs.warm_job``).

When it is done the node's membership is marked prepared (``Membership.prepared_at``, shown
by the jobs API as ``joined.prepared``), so an operator, the demo and the benchmarks can
start a job once every participant is ready.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from backend.celery import app
from backend.jobs.context import NodeContext
from backend.jobs.discovery import config_of, job_record
from backend.jobs.driver import state, workspace
from backend.jobs.models import Membership
from backend.ledger import models as mirror
from fl_node.job import training

logger = logging.getLogger(__name__)
# The Celery task that runs warm_and_mark on the node's worker (backend/jobs/tasks.py).
WARM_JOB_TASK = "jobs.warm_job"


def warm_jobs(ctx: NodeContext) -> None:
    """Prepare each open or running job this node takes part in, once per process.

    Where the actions run in this process, here; with a Celery worker, there (its caches are
    its own), by one task per job.
    """
    active = (mirror.Job.Status.OPEN, mirror.Job.Status.RUNNING)
    jobs = mirror.Job.objects.filter(status__in=active, participants__node=ctx.address).distinct()
    for job in jobs:
        if job.job_id in ctx.memory.agent.warmed:
            continue
        if not Membership.objects.filter(node=ctx.address, job_id=job.job_id).exists():
            continue  # joined on chain, not recorded here yet (the join call is finishing)
        ctx.memory.agent.warmed.add(job.job_id)  # one try: on failure round 1 loads it itself
        if ctx.actions_inline:
            warm_and_mark(ctx, job.job_id)
        else:  # by the task's name: its module (tasks.py) imports this one
            app.send_task(WARM_JOB_TASK, args=(job.job_id,), ignore_result=True)


def warm_and_mark(ctx: NodeContext, job_id: int) -> bool:
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None:
        return False
    try:
        warm(ctx, job)
    except Exception as exc:
        logger.info("could not prepare job %s ahead of its first round: %s", job_id, exc)
        return False
    Membership.objects.filter(node=ctx.address, job_id=job_id).update(prepared_at=timezone.now())
    return True


def warm(ctx: NodeContext, job: mirror.Job) -> None:
    from backend.jobs.driver.privacy import node_plan

    config = config_of(job_record(ctx, job.job_id))
    dataset = state.my_dataset(job, ctx.address)
    train, _ = workspace.local_split(ctx, dataset, config)
    _, initial, _ = workspace.global_model(ctx, job.initial_model_ref, job.initial_model_hash, config)
    workspace.scratch_model(ctx, config)
    plan = node_plan(ctx, job, config, dataset)  # calibrates the noise once; cached for the rounds
    train_config = training.train_config(config, seed=0, plan=plan)
    dry_run(ctx, config, train_config, initial, train)
    dry_encode(config, initial)


def dry_encode(config, initial: dict) -> None:
    """Encode a zero update as a trained one is, thrown away: the sparse policy's first use
    measures this machine's copy and gather speeds (fl_node.sparse, about 50 ms), which the
    last trainer of round 1 would otherwise pay between its training and its submit."""
    import torch

    from fl_node.sparse import encode_with_policy

    zero = {name: torch.zeros_like(t) for name, t in initial.items() if t.is_floating_point()}
    encode_with_policy(zero, initial, config.sparse.policy())


def dry_run(ctx: NodeContext, config, train_config, initial: dict, train) -> None:
    """One training step on one batch, thrown away: a process's first training call pays about
    a second of one-off set-up (kernels, the DP engine's hooks) that round 1 should not pay.

    It trains on this node's data, but its result is discarded unseen: nothing is released,
    so it costs no privacy (and it runs with a fixed noise multiplier, no calibration).
    """
    import dataclasses

    import numpy as np

    from fl_node.train import train_local

    step = dataclasses.replace(
        train_config,
        local_steps=1,
        target_epsilon=None,
        noise_multiplier=1.0 if train_config.private else None,
    )
    from backend.jobs.driver.trainer import training_thread

    batch = train.subset(np.arange(min(len(train), train_config.batch_size)))
    # On the thread that will train: some of the set-up (kernel caches) is per thread.
    training_thread(ctx).submit(train_local, training.build_model(config), initial, batch, step).result()
