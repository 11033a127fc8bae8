"""Job flows behind the REST API: create (config + initial model -> swarm -> chain), join, start, cancel.

Each flow checks what it can before any external step and undoes its stored blobs when the
chain refuses. The mirror tables are written by the event indexer, which each flow runs
once after its transaction so that the API shows the new state at once.
"""

from __future__ import annotations

import logging

from backend.api.errors import Conflict, InvalidInput, NotFound
from backend.datasets.budget import budget_ledger
from backend.datasets.models import Dataset
from backend.jobs import blobs, chain, remote_config
from backend.jobs.config import ConfigError, DPConfig, JobConfig, SparseConfig, check_committee_size
from backend.jobs.context import NodeContext
from backend.jobs.driver import workspace
from backend.jobs.models import JobRecord, Membership
from backend.ledger import models as mirror
from fl_node.codec import content_hash, encode_model
from fl_node.privacy import PrivacyBudgetExceeded

logger = logging.getLogger(__name__)

START_COMMITTEE_REFUSED = (
    "the first committee is drawn on chain from the job's participants when it starts; it cannot be chosen"
)


# ----------------------------------------------------------------------------- create


def build_config(request: dict, dataset: Dataset) -> JobConfig:
    """The job configuration of a create request; the schema comes from the proposer's dataset."""
    dp = dict(request.get("dp") or {"mode": "none"})
    sparse = dict(request.get("sparse") or {})
    if "tables" in sparse:
        sparse["tables"] = tuple(sparse["tables"])
    try:
        config = JobConfig(
            name=request["name"],
            model=request["model"],
            input_shape=tuple(dataset.feature_shape),
            num_classes=len(dataset.classes),
            schema_hash=dataset.schema_hash,
            rounds=request["rounds"],
            local_epochs=request["local_epochs"],
            batch_size=request["batch_size"],
            lr=request["lr"],
            strategy=request["strategy"],
            strategy_params=request.get("strategy_params") or {},
            model_options=request.get("model_options") or {},
            dp=DPConfig(**dp),
            sparse=SparseConfig(**sparse),
            committee_size=request["committee_size"],
            top_k=request["top_k"],
            margin_bp=request.get("margin_bp") or 0,
            min_trainers=request["min_trainers"],
            round_timeout_s=request["round_timeout_s"],
            score_timeout_s=request.get("score_timeout_s") or max(30, request["round_timeout_s"] // 2),
            join_timeout_s=request.get("join_timeout_s") or 3600,
            val_fraction=request.get("val_fraction") or 0.2,
            seed=request.get("seed") or 0,
            adaptive_work=request.get("adaptive_work") or False,
            max_local_steps=request.get("max_local_steps") or 0,
            robust=request.get("robust") or False,
            norm_bound=request.get("norm_bound") or 0.0,
        )
    except ConfigError as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    try:
        model = config.build_model()
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"cannot build model {config.model!r} for this data: {exc}", field="model"
        ) from None
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    unknown = [name for name in config.sparse.tables if len(shapes.get(name, ())) < 2]
    if unknown:
        raise InvalidInput(
            f"sparse.tables names what is not a tensor of 2+ dims of the model: {', '.join(unknown)}",
            field="sparse.tables",
        )
    return config


def create_job(ctx: NodeContext, request: dict) -> JobRecord:
    dataset = own_dataset(request["dataset"])
    config = build_config(request, dataset)
    try:  # the deployment's rule, before anything is stored (the contract refuses it anyway)
        check_committee_size(config.committee_size, allow_small=chain.allows_small_committees(ctx))
    except ConfigError as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    config_bytes = config.to_bytes()
    model_bytes = encode_model({k: v.detach().clone() for k, v in config.build_model().state_dict().items()})
    config_ref = blobs.put(ctx, config_bytes)
    model_ref = blobs.put(ctx, model_bytes)
    model_hash = content_hash(model_bytes)
    spec = chain.JobSpec(
        # The config's swarm reference is its content address: any node fetches the config
        # from the hash on chain alone, and the store verifies every chunk against it.
        config_hash=bytes.fromhex(config_ref),
        initial_model_ref=bytes.fromhex(model_ref),
        initial_model_hash=bytes.fromhex(model_hash),
        rounds=config.rounds,
        committee_size=config.committee_size,
        top_k=config.top_k,
        min_trainers=config.min_trainers,
        join_deadline=chain.chain_time(ctx) + config.join_timeout_s,
        train_period=config.round_timeout_s,
        score_period=config.score_timeout_s,
        max_spend_per_round=chain.planned_spend_bound(config),
        margin=config.margin_bp,
    )
    try:
        receipt = chain.propose_job(ctx, spec)
    except BaseException:
        blobs.unpin_quietly(ctx, config_ref)
        blobs.unpin_quietly(ctx, model_ref)
        raise
    job_id = receipt.event("JobProposed").args["jobId"]
    record, _ = JobRecord.objects.update_or_create(
        onchain_id=job_id,
        defaults=dict(
            name=config.name,
            config=config.as_dict(),
            config_hash="0x" + config_ref,
            initial_model_ref="0x" + model_ref,
            initial_model_hash="0x" + model_hash,
            proposer=ctx.address,
            tx_hash=receipt.tx_hash,
        ),
    )
    workspace.remember_model(ctx, model_hash, model_bytes)
    chain.sync_mirror(ctx)
    return record


def own_dataset(pk) -> Dataset:
    dataset = Dataset.objects.filter(pk=pk).first()
    if dataset is None:
        raise InvalidInput(f"this node has no dataset {pk}", field="dataset")
    return dataset


# ----------------------------------------------------------------------------- configs


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


def mirrored_job(job_id: int) -> mirror.Job:
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None:
        raise NotFound(f"no job {job_id} on chain (or not indexed yet)")
    return job


# ----------------------------------------------------------------------------- join


def projected_epsilon(ctx: NodeContext, dataset: Dataset, config: JobConfig) -> float:
    """The dataset's epsilon after every round of this job (RDP-composed with what it spent)."""
    ledger = budget_ledger(dataset)
    if not config.dp.private:
        raise InvalidInput(
            "this job trains without differential privacy (dp.mode none): it would spend an "
            "unbounded privacy budget of the dataset, so no dataset may join it",
            field="dataset",
        )
    train, val = workspace.local_split(ctx, dataset, config)
    # The plan bounds every round by its training release (a committee round costs no more at
    # the job's deciding order), so rounds x that release is the job's projection.
    plan = config.privacy_plan(num_train=len(train), num_records=len(train) + len(val), scores_per_round=1)
    release = plan.train
    assert release is not None  # a private job (checked above) has a training release
    return ledger.check(
        noise_multiplier=release.noise_multiplier,
        sample_rate=release.sample_rate,
        steps=config.rounds * release.steps,
    )


def _check_job_delta(delta: float, dataset: Dataset) -> None:
    """The job's delta against the joining dataset's size: at most 1/(10 n), as at upload."""
    limit = 1.0 / (10 * max(dataset.num_samples, 1))
    if not delta <= limit:
        raise InvalidInput(
            f"the job's delta {delta:g} is too large for dataset {dataset.name!r} of {dataset.num_samples} "
            f"records: it must be at most 1/(10·n) = {limit:.3g}",
            field="dataset",
        )


def join_job(ctx: NodeContext, job_id: int, dataset_pk) -> Membership:
    chain.sync_mirror(ctx)
    job = mirrored_job(job_id)
    if job.status != mirror.Job.Status.OPEN:
        raise Conflict(f"job {job_id} is {job.status}, not open for joining")
    if Membership.objects.filter(node=ctx.address, job_id=job_id).exists():
        raise Conflict(f"this node has joined job {job_id} already")
    dataset = own_dataset(dataset_pk)
    if not dataset.onchain_id:
        raise InvalidInput("the dataset is not registered on chain, so it cannot join a job", field="dataset")
    config = config_of(job_record(ctx, job_id))
    if dataset.schema_hash != config.schema_hash:
        raise InvalidInput(
            f"the dataset's schema (features {dataset.feature_shape}, {len(dataset.classes)} classes) "
            "does not match the job's",
            field="dataset",
        )
    if config.dp.private:
        _check_job_delta(config.dp.delta, dataset)
    try:
        projected_epsilon(ctx, dataset, config)
    except PrivacyBudgetExceeded as exc:
        raise InvalidInput(
            f"joining job {job_id} would exceed the privacy budget of dataset {dataset.name!r}: "
            f"its {config.rounds} rounds would bring epsilon to {exc.requested_epsilon:.3g} "
            f"(already spent {exc.spent_epsilon:.3g}, cap {exc.cap_epsilon:.3g})",
            field="dataset",
        ) from None
    receipt = chain.join(ctx, job_id, int(dataset.onchain_id))
    membership = Membership.objects.create(
        node=ctx.address, job_id=job_id, dataset=dataset, tx_hash=receipt.tx_hash
    )
    chain.sync_mirror(ctx)
    return membership


# ----------------------------------------------------------------------------- start / cancel


def start_job(ctx: NodeContext, job_id: int, committee: list[str] | None = None) -> str:
    """Start the job on chain; the contract draws its first committee from the participants.

    ``committee`` is refused: no proposer chooses the committee any more (the API says so).
    """
    if committee is not None:
        raise InvalidInput(START_COMMITTEE_REFUSED, field="committee")
    chain.sync_mirror(ctx)
    job = mirrored_job(job_id)
    if job.proposer != ctx.address:
        raise Conflict(f"only the job's proposer ({job.proposer}) can start it")
    if job.status != mirror.Job.Status.OPEN:
        raise Conflict(f"job {job_id} is {job.status}, not open")
    participants = list(job.participants.order_by("index").values_list("node", flat=True))
    needed = job.committee_size + job.min_trainers
    if len(participants) < needed:
        raise Conflict(
            f"job {job_id} has {len(participants)} participants; it needs {needed} "
            f"({job.committee_size} on the committee and at least {job.min_trainers} trainers)"
        )
    receipt = chain.start(ctx, job_id)
    chain.sync_mirror(ctx)
    return receipt.tx_hash


def cancel_job(ctx: NodeContext, job_id: int) -> str:
    chain.sync_mirror(ctx)
    job = mirrored_job(job_id)
    if job.proposer != ctx.address:
        raise Conflict(f"only the job's proposer ({job.proposer}) can cancel it")
    if job.status not in (mirror.Job.Status.OPEN, mirror.Job.Status.RUNNING):
        raise Conflict(f"job {job_id} is {job.status} already")
    receipt = chain.cancel(ctx, job_id)
    chain.sync_mirror(ctx)
    return receipt.tx_hash
