"""What a trainer derives from the job: the model, a round's training settings and seed, the
public rows each sparse table keeps, and a round's work under AIMD-adaptive local work.

The node's trainer (backend/jobs/driver/trainer.py) and the simulator (fl_node.simulate) train
with these, through the one local round (fl_node.local_round).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from torch import Tensor, nn

from fl_node.job.config import JobConfig
from fl_node.models import create_model
from fl_node.normalized_average import capped_lr
from fl_node.privacy import ReleasePlan
from fl_node.privacy_plan import PrivacyPlan, train_release
from fl_node.scheduler import AimdConfig
from fl_node.sparse import round_public_rows
from fl_node.train import TrainConfig

NOMINAL_SHARE = 4  # adaptive work: the nominal steps are max_local_steps // NOMINAL_SHARE


def build_model(job: JobConfig) -> nn.Module:
    """The job's architecture with the deterministic initial weights (seeded by the job)."""
    return create_model(
        job.model,
        input_shape=job.input_shape,
        num_classes=job.num_classes,
        seed=job.seed,
        **job.model_options,
    )


def round_seed(job: JobConfig, round_: int, index: int) -> int:
    """Public: seeds only what DP does not rely on (dropout, non-private shuffling) and a scripted
    attacker's draws; ``round_`` numbered from 1 as on chain, ``index`` the participant's."""
    return job.seed * 1_000_003 + round_ * 1009 + index


def train_config(job: JobConfig, seed: int, plan: PrivacyPlan | None = None) -> TrainConfig:
    """Local-training settings; under DP-SGD the noise, the sampling rate and the steps are the
    plan's (never re-derived here from the secret split's size, which is no public value)."""
    sgd = plan.train if plan is not None and plan.sgd_noise_multiplier is not None else None
    return TrainConfig(
        batch_size=job.batch_size,
        epochs=job.local_epochs,
        local_steps=sgd.steps if sgd is not None else None,
        sample_rate=sgd.sample_rate if sgd is not None else None,
        lr=job.lr,
        momentum=job.momentum,
        proximal_mu=float(job.strategy_params.get("mu", 0.0)) if job.strategy == "fedprox" else 0.0,
        noise_multiplier=plan.sgd_noise_multiplier if plan is not None else None,
        delta=job.dp.delta,
        max_grad_norm=job.dp.max_grad_norm,
        rounds=job.rounds,
        seed=seed,
    )


def kept_rows(job: JobConfig, model_state: Mapping[str, Tensor], round_: int) -> dict[str, Tensor] | None:
    """The public rows each sparse table keeps in ``round_`` (private jobs with public_rows only)."""
    sparse = job.sparse
    return round_public_rows(
        model_state,
        sparse.tables,
        sparse.public_rows,
        private=job.dp.private,
        seed=job.seed,
        round_=round_,
        rule=sparse.public_rule,
    )


# ------------------------------------------------------------------ AIMD-adaptive local work


def nominal_steps(job: JobConfig) -> int:
    """The job's nominal steps per round: the controller's start and the lr cap's reference."""
    return max(1, job.max_local_steps // NOMINAL_SHARE)


def aimd_config(job: JobConfig) -> AimdConfig:
    """The bounds of every trainer's AIMD controller (fl_node.scheduler.AimdController)."""
    return AimdConfig(base_steps=nominal_steps(job), max_steps=job.max_local_steps)


def adaptive_round(
    job: JobConfig, settings: TrainConfig, plan: PrivacyPlan, steps: int
) -> tuple[TrainConfig, ReleasePlan | None]:
    """A round of ``steps`` local steps (the trainer's controller chose them) and the release to
    charge for them. The learning rate is capped (fl_node.normalized_average.capped_lr) so no
    trajectory is longer than the nominal work's; the release is the plan's for those steps
    (fl_node.privacy_plan.train_release refuses more than the plan's bound).

    Without adaptive work: ``settings`` unchanged, and the plan's fixed release.
    """
    if not job.adaptive_work:
        return settings, plan.train
    lr = capped_lr(job.lr, steps, cap_steps=nominal_steps(job), momentum=job.momentum)
    return replace(settings, local_steps=steps, lr=lr), train_release(plan, steps)
