"""The node's round workspace, so that a round does not reload what the previous action just had.

Global models are kept decoded by content hash (training, scoring, aggregating and
registering the same round reuse one decode), a scratch module per architecture, and
each dataset's train / validation split (keyed with the dataset's secret): in the node's memory
(``ctx.memory.workspace``, backend.jobs.driver.memory), which a restart forgets.
"""

from __future__ import annotations

import time

import torch

from backend.jobs import blobs
from backend.jobs.context import NodeContext
from fl_node.codec import decode_model, update_spec
from fl_node.data import ArrayDataset
from fl_node.job import training
from fl_node.job.config import JobConfig


def keep_round(cache: dict, job_id: int, round_: int) -> None:
    """Drop the entries of ``cache`` (a node's memory, keyed (job, round, ...)) of the job's earlier rounds.

    Per-round caches of the driver keep only the round in progress: one that moved on without
    its entry being used must not stay for the life of the process.
    """
    for key in [k for k in cache if k[0] == job_id and k[1] < round_]:
        del cache[key]


def training_seen_over(ctx: NodeContext, job_id: int, round_: int, now: int) -> tuple[int, float]:
    """(contract time, this process's monotonic clock) at which this node first saw the round's
    training over, ``now`` being the contract time of this sight: the committee's key wait counts from it."""
    seen = ctx.memory.workspace.training_seen_over
    keep_round(seen, job_id, round_)
    return seen.setdefault((job_id, round_), (now, time.monotonic()))


def remember_model(ctx: NodeContext, model_hash: str, data: bytes) -> tuple[bytes, dict, dict]:
    state, server = decode_model(data)
    return ctx.memory.workspace.models.put(model_hash.removeprefix("0x"), (data, state, server))


def global_model(
    ctx: NodeContext, reference: str, model_hash: str, config: JobConfig | None = None
) -> tuple[bytes, dict[str, torch.Tensor], dict]:
    """(bytes, state, server_state) of a global model, fetched and checked once by this node.

    With the job's ``config`` the read accepts at most what its architecture encodes to.
    """
    key = model_hash.removeprefix("0x")
    cached = ctx.memory.workspace.models.get(key)
    if cached is not None:
        return cached
    bound = (
        blobs.model_max_bytes(scratch_model(ctx, config).state_dict()) if config else blobs.DEFAULT_MAX_BYTES
    )
    return remember_model(ctx, key, blobs.get_checked(ctx, reference, key, max_bytes=bound))


def scratch_model(ctx: NodeContext, config: JobConfig) -> torch.nn.Module:
    """A module of the job's architecture whose weights callers overwrite (scoring, evaluation)."""
    key = config.to_bytes()
    scratch = ctx.memory.workspace.scratch
    module = scratch.get(key)
    if module is None:
        module = scratch.put(key, training.build_model(config))
    return module


def spec_of(state) -> dict:
    return update_spec(state)


def local_split(ctx: NodeContext, dataset, config: JobConfig) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, validation) parts of this node's dataset in the job (backend.datasets.services.load_split).

    Each record's side is a keyed hash of that record alone under the dataset's secret, so the
    split of D and of D plus x differ in x alone, and nobody without the secret can compute it.
    A dataset that declared its hold-out public has ONE hold-out for every job: its
    exactly-scored records never change, and are never trained on.
    """
    from backend.datasets.services import load_split

    key = (dataset.pk, dataset.secret, bool(dataset.public_holdout), config.val_fraction, config.seed)
    splits = ctx.memory.workspace.splits
    cached = splits.get(key)
    if cached is not None:
        return cached
    split = load_split(dataset, val_fraction=config.val_fraction, job_seed=config.seed)
    full = ArrayDataset(split.x, split.y)
    return splits.put(key, (full.subset(split.train), full.subset(split.validation)))
