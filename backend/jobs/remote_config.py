"""Checks on a job configuration fetched from another node's proposal, before this node acts on it.

Another member wrote the config; the chain holds only its hash and the JobSpec. So a config
is checked twice before this node builds its model, trains or scores with it:

* against THIS node's limits (settings DEFL_MAX_*): the built model's parameter and buffer
  count (counted on PyTorch's meta device, so a model of 10^12 parameters costs nothing to
  measure), model options, batch size, local epochs, rounds, periods, and the input shape and
  class count of this node's own datasets of the job's schema;
* against the job's on-chain spec (the mirrored ``ledger.Job``): rounds, committee size,
  top-k, minimum trainers, round and scoring periods, time-based deadlines, a join deadline no
  later than the config allows. A config that says one thing while the contract enforces
  another would make this node plan rounds the chain does not have.

A config that fails is declined: ``RemoteConfigRejected`` says why in one sentence, the agent
logs it and does not take part in the job. Plain Python apart from the datasets lookup, which
the caller passes in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from backend.api.errors import Conflict
from fl_node.job import training
from fl_node.job.config import JobConfig
from fl_node.job.limits import (
    MAX_CLASSES,
    MAX_CLIP_NORM,
    MAX_INPUT_DIMS,
    MAX_INPUT_ELEMENTS,
    MAX_JOB_NAME,
    MAX_LR,
    MAX_OPTION_INT,
    MAX_OPTION_LIST,
    MAX_OPTION_TEXT,
    MAX_OPTIONS,
    MAX_SEED,
    MAX_TARGET_EPSILON,
    MIN_DELTA,
    MODEL_OPTION_BOUNDS,
)
from fl_node.job.plan import planned_spend_bound

if TYPE_CHECKING:
    from backend.datasets.models import Dataset

# The proposer computed the join deadline from its own clock: allow for skew between its clock
# and ours (the check is against a deadline far beyond what the config says, not seconds).
JOIN_DEADLINE_SLACK_S = 600


class RemoteConfigRejected(Conflict):
    """The config of a job proposed elsewhere is outside this node's limits or contradicts the chain.

    A 409 where the API meets it (joining or showing the job): the sentence says why.
    """

    def __init__(self, job_id: int, reason: str):
        super().__init__(f"this node declines job {job_id}: {reason}")
        self.job_id = job_id
        self.reason = reason


@dataclass(frozen=True)
class NodeLimits:
    max_model_params: int
    max_batch_size: int
    max_local_epochs: int
    max_rounds: int
    max_period_s: int

    @classmethod
    def from_settings(cls) -> NodeLimits:
        return cls(
            max_model_params=settings.DEFL_MAX_MODEL_PARAMS,
            max_batch_size=settings.DEFL_MAX_BATCH_SIZE,
            max_local_epochs=settings.DEFL_MAX_LOCAL_EPOCHS,
            max_rounds=settings.DEFL_MAX_ROUNDS,
            max_period_s=settings.DEFL_MAX_JOB_PERIOD_S,
        )


@dataclass(frozen=True)
class LocalSchema:
    """What this node's own datasets of the job's schema say a sample looks like."""

    feature_shape: tuple[int, ...]
    num_classes: int


def check_remote_config(
    job,
    config: JobConfig,
    *,
    limits: NodeLimits,
    schema: LocalSchema | None,
    now: int | None = None,
) -> None:
    """Raise RemoteConfigRejected unless ``config`` is within ``limits`` and equal to ``job``'s spec.

    ``job``: the mirrored on-chain job (ledger.models.Job or anything with its fields);
    ``schema``: this node's datasets of ``config.schema_hash``, or None if it has none;
    ``now``: the chain's time, to bound the join deadline (skipped when None).
    """
    try:
        _check_bounds(config, limits, schema)
        _check_spec(job, config, now)
        _check_model_size(config, limits)
    except _Refused as exc:
        raise RemoteConfigRejected(job.job_id, str(exc)) from None


class _Refused(Exception):
    pass


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise _Refused(reason)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_bounds(config: JobConfig, limits: NodeLimits, schema: LocalSchema | None) -> None:
    _require(len(config.name) <= MAX_JOB_NAME, f"its name is longer than {MAX_JOB_NAME} characters")
    _require(
        _is_int(config.rounds) and config.rounds <= limits.max_rounds,
        f"{config.rounds} rounds is more than this node's limit of {limits.max_rounds} (DEFL_MAX_ROUNDS)",
    )
    _require(
        _is_int(config.local_epochs) and config.local_epochs <= limits.max_local_epochs,
        f"{config.local_epochs} local epochs is more than this node's limit of "
        f"{limits.max_local_epochs} (DEFL_MAX_LOCAL_EPOCHS)",
    )
    _require(
        _is_int(config.batch_size) and config.batch_size <= limits.max_batch_size,
        f"batch size {config.batch_size} is more than this node's limit of "
        f"{limits.max_batch_size} (DEFL_MAX_BATCH_SIZE)",
    )
    for name in ("round_timeout_s", "score_timeout_s", "join_timeout_s"):
        value = getattr(config, name)
        _require(
            _is_int(value) and value <= limits.max_period_s,
            f"{name} {value} is longer than this node's limit of {limits.max_period_s} s (DEFL_MAX_JOB_PERIOD_S)",
        )
    _require(
        _is_int(config.seed) and 0 <= config.seed <= MAX_SEED,
        f"its seed is not an integer in [0, {MAX_SEED}]",
    )
    for name in ("committee_size", "top_k", "min_trainers", "num_classes"):
        _require(_is_int(getattr(config, name)), f"{name} is not an integer")
    _require(config.num_classes <= MAX_CLASSES, f"{config.num_classes} classes is more than {MAX_CLASSES}")
    _check_shape(config, schema)
    _check_options("model_options", config.model_options, MODEL_OPTION_BOUNDS.get(config.model, {}))
    _check_options("strategy_params", config.strategy_params, {})
    _require(
        isinstance(config.schema_hash, str) and re.fullmatch(r"[0-9a-f]{64}", config.schema_hash) is not None,
        "its schema hash is not 64 hex digits",
    )
    _require(
        isinstance(config.lr, int | float) and math.isfinite(config.lr) and config.lr <= MAX_LR,
        f"its learning rate is not a number up to {MAX_LR}",
    )
    dp = config.dp
    for name in ("target_epsilon", "delta", "max_grad_norm"):
        value = getattr(dp, name)
        _require(
            value is None or (isinstance(value, int | float) and math.isfinite(value)),
            f"dp.{name} is not a finite number",
        )
    if dp.private:
        # JobConfig refuses a private job without a positive target epsilon (ConfigError).
        assert dp.target_epsilon is not None
        # Noise calibration searches over these: keep them where the accountants are well defined.
        _require(
            dp.target_epsilon <= MAX_TARGET_EPSILON,
            f"dp.target_epsilon {dp.target_epsilon} is above {MAX_TARGET_EPSILON}",
        )
        _require(dp.delta >= MIN_DELTA, f"dp.delta {dp.delta} is below {MIN_DELTA}")
        _require(
            dp.max_grad_norm <= MAX_CLIP_NORM, f"dp.max_grad_norm {dp.max_grad_norm} is above {MAX_CLIP_NORM}"
        )


def _check_shape(config: JobConfig, schema: LocalSchema | None) -> None:
    shape = config.input_shape
    _require(
        all(_is_int(d) for d in shape) and 1 <= len(shape) <= MAX_INPUT_DIMS,
        f"its input shape {list(shape)[:8]} is not 1 to {MAX_INPUT_DIMS} integers",
    )
    if schema is None:
        # No dataset here to compare with (this node will not train): only a sane size.
        _require(
            math.prod(shape) <= MAX_INPUT_ELEMENTS,
            f"its input shape {list(shape)} has more than {MAX_INPUT_ELEMENTS} elements",
        )
        return
    _require(
        tuple(shape) == tuple(schema.feature_shape),
        f"its input shape {list(shape)} differs from this node's datasets of the job's schema "
        f"({list(schema.feature_shape)})",
    )
    _require(
        config.num_classes == schema.num_classes,
        f"it has {config.num_classes} classes where this node's datasets of the job's schema have "
        f"{schema.num_classes}",
    )


def _check_options(label: str, options: dict, bounds: dict[str, tuple[int, int]]) -> None:
    _require(isinstance(options, dict), f"{label} is not a mapping")
    _require(len(options) <= MAX_OPTIONS, f"{label} has more than {MAX_OPTIONS} entries")
    for key, value in options.items():
        _require(
            isinstance(key, str) and len(key) <= MAX_OPTION_TEXT,
            f"{label} has a key that is not a short name",
        )
        values = value if isinstance(value, list) else [value]
        _require(len(values) <= MAX_OPTION_LIST, f"{label}.{key} lists more than {MAX_OPTION_LIST} values")
        low, high = bounds.get(key, (-MAX_OPTION_INT, MAX_OPTION_INT))
        for item in values:
            if isinstance(item, bool):
                continue
            if _is_int(item):
                _require(low <= item <= high, f"{label}.{key} = {item} is outside [{low}, {high}]")
            elif isinstance(item, float):
                _require(
                    math.isfinite(item) and abs(item) <= MAX_OPTION_INT, f"{label}.{key} is out of range"
                )
            elif isinstance(item, str):
                _require(
                    len(item) <= MAX_OPTION_TEXT, f"{label}.{key} is a text longer than {MAX_OPTION_TEXT}"
                )
            else:
                raise _Refused(f"{label}.{key} is not a number, a flag or a short text")


def _check_spec(job, config: JobConfig, now: int | None) -> None:
    """The config must say what the contract enforces (backend.jobs_api.services.create_job wrote both)."""
    pairs = [
        ("rounds", job.rounds, config.rounds),
        ("committee_size", job.committee_size, config.committee_size),
        ("top_k", job.top_k, config.top_k),
        ("min_trainers", job.min_trainers, config.min_trainers),
        ("train_period", job.train_period, config.round_timeout_s),
        ("score_period", job.score_period, config.score_timeout_s),
        ("margin", job.margin, config.margin_bp),
    ]
    for name, on_chain, in_config in pairs:
        _require(
            on_chain == in_config,
            f"its config says {name} {in_config} where the on-chain job spec says {on_chain}",
        )
    _require(not job.use_blocks, "its on-chain deadlines count blocks, but its config counts seconds")
    # The per-release privacy bound the chain enforces must be the one the config's DP implies.
    planned = planned_spend_bound(config)
    _require(
        job.max_spend_per_round == planned,
        f"its on-chain max_spend_per_round {job.max_spend_per_round} differs from the {planned} "
        "its privacy settings give",
    )
    if now is not None:
        _require(
            job.join_deadline <= now + config.join_timeout_s + JOIN_DEADLINE_SLACK_S,
            f"its on-chain join deadline is later than the config's join_timeout_s ({config.join_timeout_s} s) "
            "allows",
        )


def _check_model_size(config: JobConfig, limits: NodeLimits) -> None:
    """Build the model on the meta device (no memory, no data) and count what it would allocate."""
    import torch

    try:
        with torch.device("meta"):
            model = training.build_model(config)
    except Exception as exc:  # any factory error: the config does not describe a usable model
        raise _Refused(f"its model cannot be built: {type(exc).__name__}") from None
    size = sum(t.numel() for t in model.parameters()) + sum(t.numel() for t in model.buffers())
    _require(
        size <= limits.max_model_params,
        f"its model has {size} parameters and buffers, more than this node's limit of "
        f"{limits.max_model_params} (DEFL_MAX_MODEL_PARAMS)",
    )
    # Its sparse tables (fl_node.sparse) must be tensors of 2+ dims of its model: the trainer
    # draws their public rows every round.
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    bad = [name for name in config.sparse.tables if len(shapes.get(name, ())) < 2]
    _require(
        not bad, f"its sparse.tables name {', '.join(bad[:4])[:200]}: not tensors of 2+ dims of its model"
    )


def local_schema(datasets: Iterable[Dataset]) -> LocalSchema | None:
    """The schema of this node's datasets of one schema hash (they all share it), or None."""
    for dataset in datasets:
        return LocalSchema(feature_shape=tuple(dataset.feature_shape), num_classes=len(dataset.classes))
    return None
