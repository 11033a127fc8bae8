"""This node's record of a job: its configuration fetched by the config hash on chain, checked
against this node's limits and the on-chain spec (remote_config), and kept (``JobRecord``).

The driver reads every job's configuration through here (the agent discovers new jobs, the
actions and the warm-up read their job's); so does the jobs API (backend/jobs_api).
"""

from __future__ import annotations

from backend.api.errors import Conflict, NotFound
from backend.datasets.models import Dataset
from backend.jobs import blobs, chain, remote_config
from backend.jobs.context import NodeContext
from backend.jobs.models import JobRecord
from backend.ledger import models as mirror
from fl_node.job.config import ConfigError, JobConfig


def job_record(ctx: NodeContext, job_id: int) -> JobRecord:
    """This node's record of a job, fetching its config from the swarm store the first time."""
    record = JobRecord.objects.filter(onchain_id=job_id).first()
    if record is not None:
        return record
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None:
        raise NotFound(f"no job {job_id} on chain (or not indexed yet)")
    return discover(ctx, job)


def discover(ctx: NodeContext, job: mirror.Job) -> JobRecord:
    """Fetch and check a job's configuration by the config hash on chain, and keep it."""
    blob = blobs.get(ctx, job.config_hash, max_bytes=blobs.CONFIG_MAX_BYTES)
    try:
        config = JobConfig.from_bytes(blob)
    except ConfigError as exc:
        raise Conflict(f"job {job.job_id}'s configuration is unusable: {exc}") from None
    # Another member wrote it: within this node's limits and equal to the on-chain spec, or the
    # job is declined (RemoteConfigRejected, a 409 with the reason; the agent logs it once).
    remote_config.check_remote_config(
        job,
        config,
        limits=ctx.limits,
        schema=remote_config.local_schema(Dataset.objects.filter(schema_hash=config.schema_hash)[:1]),
        now=chain.chain_time(ctx),
    )
    record, _ = JobRecord.objects.get_or_create(
        onchain_id=job.job_id,
        defaults=dict(
            name=config.name,
            config=config.as_dict(),
            config_hash=job.config_hash,
            initial_model_ref=job.initial_model_ref,
            initial_model_hash=job.initial_model_hash,
            proposer=job.proposer,
        ),
    )
    return record


def config_of(record: JobRecord) -> JobConfig:
    return JobConfig.from_dict(record.config)
