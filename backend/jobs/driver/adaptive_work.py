"""AIMD-adaptive local work in the node (issue #18): how many local steps this node trains per round.

A job with ``adaptive_work`` (and its bound ``max_local_steps``) lets every trainer choose its own
work per round instead of the same fixed epochs, so fast members stop idling while slow ones
finish:

* **Controller** (:func:`plan_round`, :func:`observe`): this node's
  :class:`fl_node.scheduler.AimdController` for the job, kept in the database
  (``backend.cluster.models.WorkController``, so it survives a restart), is fed each round with
  the measured training seconds and the round's target (``TARGET_FRACTION`` of the job's
  ``round_timeout_s``: the rest is left for the transfers, the transactions and the scores),
  and sets the next round's steps: additive increase while the round ends early,
  multiplicative decrease when it ran late, never above ``max_local_steps``. It starts from the
  nominal work, a quarter of the bound (the scheduler's default bound is 4x the nominal).
* **Learning-rate cap**: a round of more than the nominal steps trains at
  :func:`fl_node.normalized_average.capped_lr`, so no member's local trajectory is longer than
  the nominal one's (more steps: a less noisy estimate of the same move).
* **Privacy**: the job's DP-SGD noise is calibrated for ``max_local_steps`` per round
  (``JobConfig.privacy_plan``), and each round reserves and charges the release of the steps it
  actually runs (:func:`fl_node.privacy_plan.train_release`, which refuses more than the plan's
  bound; the controller never asks for more): more steps are charged more, and no round can
  exceed the job's planned per-round release.
* **The update carries its steps** (:func:`with_steps`): a ``steps`` entry in the update's
  DeFL metadata, inside the bytes whose content hash goes on chain, so every committee member
  reads the same claim. It is hostile input: :func:`claimed_steps` clamps it to
  ``[1, max_local_steps]`` and reads a missing or malformed claim as the nominal steps.
* **Aggregation** (``fl_node.job.aggregation.strategy``): FedNova
  (:func:`fl_node.normalized_average.normalized_average`) with the job's momentum, the lr cap and
  the nominal work as its server step: pure and deterministic, so every committee member computes
  the same bytes (the simulator's aggregation too).
"""

from __future__ import annotations

import json

from django.db import transaction

from backend.cluster.models import Task, WorkController
from fl_node.job import training
from fl_node.job.config import JobConfig
from fl_node.job.training import aimd_config, nominal_steps
from fl_node.normalized_average import clamp_steps
from fl_node.privacy import ReleasePlan
from fl_node.privacy_plan import PrivacyPlan
from fl_node.scheduler import AimdController
from fl_node.train import TrainConfig

TARGET_FRACTION = 0.5  # of round_timeout_s: the training's share of the round
STEPS_KEY = "steps"  # the update's metadata entry
_METADATA = "defl"  # fl_node.codec's metadata key
_MAX_HEADER = 64 * 1024 * 1024  # fl_node.codec's bound on a header


def target_seconds(config: JobConfig) -> float:
    return TARGET_FRACTION * config.round_timeout_s


def _controller(row: WorkController, config: JobConfig) -> AimdController:
    try:
        return AimdController.restore(aimd_config(config), row.state or {"steps": row.steps})
    except ValueError:  # a row edited by hand into nonsense: start over from the nominal work
        return AimdController(aimd_config(config))


def _row(node: str, job_id: int, config: JobConfig, *, lock: bool = False) -> WorkController:
    rows = WorkController.objects.select_for_update() if lock else WorkController.objects
    row, _ = rows.get_or_create(node=node, job_id=job_id, defaults={"steps": nominal_steps(config)})
    return row


def steps_for(node: str, job_id: int, config: JobConfig) -> int:
    """The local steps this node trains in its next round of the job (within the bound)."""
    return _controller(_row(node, job_id, config), config).steps


def plan_round(
    node: str, job_id: int, config: JobConfig, train_config: TrainConfig, plan: PrivacyPlan
) -> tuple[TrainConfig, ReleasePlan | None]:
    """The round's training settings and the release to reserve for them.

    Without adaptive work: unchanged, and the plan's fixed release.
    """
    if not config.adaptive_work:
        return train_config, plan.train
    return training.adaptive_round(config, train_config, plan, steps_for(node, job_id, config))


def observe(node: str, job_id: int, config: JobConfig, round_: int, steps: int, seconds: float) -> int:
    """Feed one round's measurement to the controller; returns the next round's steps.

    A round is observed once: a retrain of the same round (a discarded speculative update)
    does not move the controller twice.
    """
    with transaction.atomic():
        row = _row(node, job_id, config, lock=True)
        controller = _controller(row, config)
        if round_ <= row.last_round:
            return controller.steps
        target = target_seconds(config)
        controller.observe(steps=steps, seconds=max(float(seconds), 1e-6), target_seconds=target)
        row.steps, row.state = controller.steps, controller.state()
        row.last_round, row.last_steps, row.last_seconds, row.target_seconds = round_, steps, seconds, target
        row.save()
        return controller.steps


def finish_round(
    node: str,
    job_id: int,
    config: JobConfig,
    round_: int,
    train_config: TrainConfig,
    blob: bytes,
    seconds: float,
) -> bytes:
    """After training: observe the round and tag the encoded update with its steps.

    The time observed is the training attempt's own (the cluster task's ``duration_s``): a wait
    for a slot, or the worker's first registration, says nothing about the step time. ``seconds``
    (the caller's measurement) stands in when there is no task row.
    """
    if not config.adaptive_work:
        return blob
    steps = int(train_config.local_steps or nominal_steps(config))
    ran = (
        Task.objects.filter(node=node, job_id=job_id, round=round_, kind=Task.Kind.TRAIN)
        .values_list("duration_s", flat=True)
        .first()
    )
    observe(node, job_id, config, round_, steps, ran if ran else seconds)
    return with_steps(blob, steps)


# ------------------------------------------------------------------ the update's step claim


def _split(blob: bytes) -> tuple[dict, dict, int]:
    """(safetensors header, our metadata, header length) of an encoded update; ValueError if malformed."""
    if len(blob) < 8:
        raise ValueError("blob too short")
    length = int.from_bytes(blob[:8], "little")
    if length > _MAX_HEADER or 8 + length > len(blob):
        raise ValueError("bad header length")
    header = json.loads(bytes(blob[8 : 8 + length]).decode("utf-8"))
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise ValueError("no metadata")
    meta = json.loads(header["__metadata__"][_METADATA])
    if not isinstance(meta, dict):
        raise ValueError("bad metadata")
    return header, meta, length


def with_steps(blob: bytes, steps: int) -> bytes:
    """``blob`` with ``steps`` in its DeFL metadata; the tensors' bytes are untouched.

    The header is rewritten the way fl_node.codec writes it (compact JSON in the same key
    order, padded with spaces to 8 bytes), so the result decodes to the same update.
    """
    header, meta, length = _split(blob)
    meta[STEPS_KEY] = int(steps)
    header["__metadata__"][_METADATA] = json.dumps(meta, sort_keys=True, separators=(",", ":"))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(blob[8 + length :])


def claimed_steps(blob: bytes, config: JobConfig) -> int:
    """The steps an update claims, bounded by the job: [1, max_local_steps]; the nominal if none.

    A job without adaptive work reads no claim at all (its aggregation ignores steps).
    """
    if not config.adaptive_work:
        return nominal_steps(config)
    try:
        claim = _split(blob)[1].get(STEPS_KEY)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return nominal_steps(config)
    if not isinstance(claim, int) or isinstance(claim, bool):
        return nominal_steps(config)
    return clamp_steps(claim, max_steps=config.max_local_steps)
