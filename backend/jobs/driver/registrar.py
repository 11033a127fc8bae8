"""When a round's global model is fixed: serve it (hot swap), and record this node's metrics.

Serving happens as soon as the model is fixed; measuring it waits while this node scores the
next round (see planner), as nothing waits for a round's metrics.
"""

from __future__ import annotations

from backend.jobs.context import NodeContext
from backend.jobs.driver import state, timing, workspace
from backend.jobs.driver.state import Outcome
from backend.jobs.models import RoundMetric
from backend.ledger import models as mirror
from backend.serving.services import register_global_model
from fl_node.job.config import JobConfig
from fl_node.train import evaluate


def register_round(ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int) -> Outcome:
    fixed = job.global_models.get(round=round_)
    data, _, _ = workspace.global_model(ctx, fixed.reference, fixed.model_hash, config)
    register_global_model(
        job=job.job_id,
        round=round_,
        architecture=config.model,
        input_shape=config.input_shape,
        num_classes=config.num_classes,
        reference=fixed.reference.removeprefix("0x"),
        content_hash=fixed.model_hash.removeprefix("0x"),
        onchain_hash=fixed.model_hash,
        options=config.model_options,
        data=data,
    )
    return Outcome(True, f"serving round {round_}'s model")


def measure_round(ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int) -> Outcome:
    fixed = job.global_models.get(round=round_)
    _, global_state, _ = workspace.global_model(ctx, fixed.reference, fixed.model_hash, config)
    dataset = state.my_dataset(job, ctx.address)
    _, val = workspace.local_split(ctx, dataset, config)
    model = workspace.scratch_model(ctx, config)
    with timing.part(timing.EVALUATE):
        model.load_state_dict(global_state)
        metrics = evaluate(model, *val.tensors())
    RoundMetric.objects.update_or_create(
        node=ctx.address,
        job_id=job.job_id,
        round=round_,
        defaults=dict(
            accuracy=metrics["accuracy"],
            loss=metrics["loss"],
            epsilon=state.job_epsilon(dataset, job.job_id, config),
            model_hash=fixed.model_hash,
        ),
    )
    return Outcome(True, f"validation accuracy {metrics['accuracy']:.3f}")
