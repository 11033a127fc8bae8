"""Job flows behind the REST API: create (config + initial model -> swarm -> chain), join, start, cancel.

Each flow checks everything it can before any external step, and undoes its stored blobs when
the chain refuses: a job goes on chain only when this node could join it and it could start on
the federation. What the request alone gets wrong is a 400 (the serializers, the job's own
rules in JobConfig); what this node's state refuses (its datasets, their budgets, the node's
limits, the deployment's committee rule, the members that can join) a 409 naming the field.
The mirror tables are written by the event indexer, which each flow runs once after its
transaction so that the API shows the new state at once.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from backend.api.errors import Conflict, InvalidInput, NotFound
from backend.datasets.budget import budget_ledger
from backend.datasets.models import Dataset
from backend.jobs import blobs, chain, remote_config
from backend.jobs.context import NodeContext
from backend.jobs.discovery import config_of, job_record
from backend.jobs.driver import actions, workspace
from backend.jobs.driver.planner import Due
from backend.jobs.models import JobRecord, Membership, RoundAction
from backend.jobs_api.federation import joinable_members
from backend.ledger import models as mirror
from fl_node.codec import content_hash, encode_model
from fl_node.job import training
from fl_node.job.config import ConfigError, DPConfig, JobConfig, SparseConfig, check_committee_size
from fl_node.job.plan import participant_plan, planned_spend_bound
from fl_node.privacy import ADD_REMOVE, PrivacyBudgetExceeded
from fl_node.robust import DEFAULT_DEFENSE, DEFAULT_MAX_SHARE_BP

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
            defense=request.get("defense") or DEFAULT_DEFENSE,
            max_share_bp=request.get("max_share_bp") or DEFAULT_MAX_SHARE_BP,
            norm_bound=request.get("norm_bound") or 0.0,
        )
    except ConfigError as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    try:
        with torch.device("meta"):  # the shapes only: no memory for a large model's weights
            model = training.build_model(config)
    except (ValueError, TypeError, RuntimeError) as exc:
        # The model meets the dataset's shape here: a CNN on tabular data, options it cannot take.
        field = "model_options" if config.model_options else "model"
        raise Conflict(
            f"model {config.model!r} cannot be built for dataset {dataset.name!r} "
            f"(features {list(dataset.feature_shape)}, {len(dataset.classes)} classes): {exc}",
            field=field,
        ) from None
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    unknown = [name for name in config.sparse.tables if len(shapes.get(name, ())) < 2]
    if unknown:
        raise Conflict(
            f"sparse.tables names what is not a tensor of 2+ dims of the model: {', '.join(unknown)}",
            field="sparse.tables",
        )
    return config


def check_before_chain(ctx: NodeContext, config: JobConfig, dataset: Dataset) -> None:
    """Everything that would make the job unusable once on chain, checked before anything is stored.

    The proposer's own join must pass (its dataset on chain, delta <= 1/(10 n), its budget
    covers every round), every node must accept the config (this node's limits are the
    same checks it applies to others' jobs), the deployment must take the committee, and
    enough members must be able to join for the job to start.
    """
    chain.sync_mirror(ctx)  # the members and their datasets as the chain has them now
    try:  # the deployment's rule (the contract refuses it anyway)
        check_committee_size(config.committee_size, allow_small=chain.allows_small_committees(ctx))
    except ConfigError as exc:
        raise Conflict(f"{exc} on this deployment", field=exc.field) from None
    if not dataset.onchain_id:
        raise Conflict(
            f"dataset {dataset.name!r} is not registered on chain yet, so this node could not join the job with it",
            field="dataset",
        )
    _check_job_delta(config.dp.delta, dataset, field="dp.delta")
    _check_adjacency(config, dataset, field="dp.adjacency")
    _check_node_limits(ctx, config, dataset)
    _check_budget(ctx, config, dataset, field="dp.target_epsilon")
    _check_federation(config)


def _check_node_limits(ctx: NodeContext, config: JobConfig, dataset: Dataset) -> None:
    """The checks every node applies to a job proposed by another (backend.jobs.remote_config),
    on the spec this node is about to send: a job this node would decline, no node should get."""
    spec = SimpleNamespace(
        job_id=0,
        rounds=config.rounds,
        committee_size=config.committee_size,
        top_k=config.top_k,
        min_trainers=config.min_trainers,
        train_period=config.round_timeout_s,
        score_period=config.score_timeout_s,
        margin=config.margin_bp,
        use_blocks=False,
        max_spend_per_round=planned_spend_bound(config),
        join_deadline=0,
    )
    try:
        remote_config.check_remote_config(
            spec, config, limits=ctx.limits, schema=remote_config.local_schema([dataset]), now=None
        )
    except remote_config.RemoteConfigRejected as exc:
        raise Conflict(
            f"the nodes would decline this job: {exc.reason}", field=_field_named(exc.reason)
        ) from None


def _field_named(reason: str) -> str | None:
    """The request field a sentence of remote_config is about (its first word that names one)."""
    for name in ("model_options", "strategy_params", "batch_size", "round_timeout_s", "score_timeout_s",
                 "join_timeout_s", "sparse", "lr", "dp.", "model", "seed"):  # fmt: skip
        if name in reason:
            return {"dp.": "dp.target_epsilon", "sparse": "sparse.tables"}.get(name, name)
    return None


def _check_federation(config: JobConfig) -> None:
    """A job starts with committee_size + min_trainers participants: enough members must be able to join."""
    members = joinable_members(config.schema_hash, config.dp.target_epsilon if config.dp.private else None)
    needed = config.committee_size + config.min_trainers
    if len(members) >= needed:
        return
    who = ", ".join(m.name or m.address for m in members[:8]) or "none"
    need = f" with ε {config.dp.target_epsilon:g} left" if config.dp.private else ""
    if config.committee_size >= len(members):
        raise Conflict(
            f"a committee of {config.committee_size} leaves no trainer: only {len(members)} member(s) can "
            f"join a job of this dataset's schema{need} ({who})",
            field="committee_size",
        )
    raise Conflict(
        f"starting needs {needed} participants (a committee of {config.committee_size} and at least "
        f"{config.min_trainers} trainers), but only {len(members)} member(s) can join a job of this "
        f"dataset's schema{need} ({who}): at most {len(members) - config.committee_size} minimum trainers",
        field="min_trainers",
    )


def create_job(ctx: NodeContext, request: dict) -> JobRecord:
    dataset = own_dataset(request["dataset"])
    config = build_config(request, dataset)
    check_before_chain(ctx, config, dataset)
    config_bytes = config.to_bytes()
    model_bytes = encode_model(
        {k: v.detach().clone() for k, v in training.build_model(config).state_dict().items()}
    )
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
        max_spend_per_round=planned_spend_bound(config),
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
    chain.sync_mirror(ctx, through_block=receipt.block_number)
    return record


def own_dataset(pk) -> Dataset:
    dataset = Dataset.objects.filter(pk=pk).first()
    if dataset is None:
        raise Conflict(f"this node has no dataset {pk}", field="dataset")
    return dataset


# ----------------------------------------------------------------------------- the mirror


def mirrored_job(job_id: int) -> mirror.Job:
    job = mirror.Job.objects.filter(job_id=job_id).first()
    if job is None:
        raise NotFound(f"no job {job_id} on chain (or not indexed yet)")
    return job


# ----------------------------------------------------------------------------- join


NO_DP = (
    "this job trains without differential privacy (dp.mode none): it would spend an "
    "unbounded privacy budget of the dataset, so no dataset may join it"
)


def projected_epsilon(ctx: NodeContext, dataset: Dataset, config: JobConfig) -> float:
    """The dataset's epsilon after every round of this job (RDP-composed with what it spent)."""
    ledger = budget_ledger(dataset)
    if not config.dp.private:
        raise Conflict(NO_DP, field="dataset")
    # The plan bounds every round by its training release (a committee round costs no more at
    # the job's deciding order), so rounds x that release is the job's projection. It follows
    # from public values (the dataset's size), as every member computes it.
    plan = participant_plan(
        config, samples=dataset.num_samples, public_holdout=dataset.public_holdout, scores_per_round=1
    )
    release = plan.train
    assert release is not None  # a private job (checked above) has a training release
    return ledger.check(
        noise_multiplier=release.noise_multiplier,
        sample_rate=release.sample_rate,
        steps=config.rounds * release.steps,
    )


def _check_job_delta(delta: float, dataset: Dataset, *, field: str = "dataset") -> None:
    """The job's delta against the joining dataset's size: at most 1/(10 n), as at upload."""
    limit = 1.0 / (10 * max(dataset.num_samples, 1))
    if not delta <= limit:
        raise Conflict(
            f"the job's delta {delta:.3g} is too large for dataset {dataset.name!r} of {dataset.num_samples} "
            f"records: it must be at most 1/(10·n) = {limit:.3g}",
            field=field,
        )


def _check_adjacency(config: JobConfig, dataset: Dataset, *, field: str = "dataset") -> None:
    """An add-remove job takes only datasets whose registered size is a DP count: a dataset that
    registered its exact size protects no record against add/remove (anyone sees the size)."""
    if config.dp.private and config.dp.adjacency == ADD_REMOVE and not dataset.count_noise_std > 0:
        raise Conflict(
            f"dataset {dataset.name!r} registered its exact size, so its records are protected under "
            "replace-one adjacency only; it can join a job with dp.adjacency replace-one, not add-remove",
            field=field,
        )


def _check_budget(ctx: NodeContext, config: JobConfig, dataset: Dataset, *, field: str = "dataset") -> None:
    """Every round of the job must fit in the dataset's privacy budget left (what joining checks)."""
    try:
        projected_epsilon(ctx, dataset, config)
    except PrivacyBudgetExceeded as exc:
        raise Conflict(
            f"the job's {config.rounds} rounds would bring dataset {dataset.name!r}'s epsilon to "
            f"{exc.requested_epsilon:.3g} (already spent {exc.spent_epsilon:.3g}, cap {exc.cap_epsilon:.3g}): "
            "lower the target epsilon or the rounds, or choose another dataset",
            field=field,
        ) from None


def join_job(ctx: NodeContext, job_id: int, dataset_pk) -> Membership:
    chain.sync_mirror(ctx)
    job = mirrored_job(job_id)
    if job.status != mirror.Job.Status.OPEN:
        raise Conflict(f"job {job_id} is {job.status}, not open for joining")
    if Membership.objects.filter(node=ctx.address, job_id=job_id).exists():
        raise Conflict(f"this node has joined job {job_id} already")
    dataset = own_dataset(dataset_pk)
    if not dataset.onchain_id:
        raise Conflict("the dataset is not registered on chain, so it cannot join a job", field="dataset")
    config = config_of(job_record(ctx, job_id))
    if dataset.schema_hash != config.schema_hash:
        raise Conflict(
            f"the dataset's schema (features {dataset.feature_shape}, {len(dataset.classes)} classes) "
            "does not match the job's",
            field="dataset",
        )
    if not config.dp.private:
        raise Conflict(NO_DP, field="dataset")
    _check_job_delta(config.dp.delta, dataset)
    _check_adjacency(config, dataset)
    try:
        projected_epsilon(ctx, dataset, config)
    except PrivacyBudgetExceeded as exc:
        raise Conflict(
            f"joining job {job_id} would exceed the privacy budget of dataset {dataset.name!r}: "
            f"its {config.rounds} rounds would bring epsilon to {exc.requested_epsilon:.3g} "
            f"(already spent {exc.spent_epsilon:.3g}, cap {exc.cap_epsilon:.3g})",
            field="dataset",
        ) from None
    receipt = chain.join(ctx, job_id, int(dataset.onchain_id))
    membership = Membership.objects.create(
        node=ctx.address, job_id=job_id, dataset=dataset, tx_hash=receipt.tx_hash
    )
    chain.sync_mirror(ctx, through_block=receipt.block_number)
    return membership


# ----------------------------------------------------------------------------- start / cancel


def start_job(ctx: NodeContext, job_id: int, committee: list[str] | None = None) -> str:
    """Start the job on chain: the joins close, and the participants reveal the draw secrets they
    committed to when they joined (this node's own at once, the others' agents within a score
    period); the contract draws the first committee from them (JobStarted names it).

    ``committee`` is refused: no proposer chooses the committee (the API says so).
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
    chain.sync_mirror(ctx, through_block=receipt.block_number)
    if ctx.address in participants:
        # Through the agent's REVEAL claim: the agent, ticking on the start's block, plans the same
        # reveal, and two reveals estimated before either was mined both went out (one reverted).
        actions.run_now(ctx, Due(job_id, 0, RoundAction.Kind.REVEAL))
    return receipt.tx_hash


def cancel_job(ctx: NodeContext, job_id: int) -> str:
    chain.sync_mirror(ctx)
    job = mirrored_job(job_id)
    if job.proposer != ctx.address:
        raise Conflict(f"only the job's proposer ({job.proposer}) can cancel it")
    if job.status not in (mirror.Job.Status.OPEN, mirror.Job.Status.DRAWING, mirror.Job.Status.RUNNING):
        raise Conflict(f"job {job_id} is {job.status} already")
    receipt = chain.cancel(ctx, job_id)
    chain.sync_mirror(ctx, through_block=receipt.block_number)
    return receipt.tx_hash
