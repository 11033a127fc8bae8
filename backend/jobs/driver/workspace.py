"""The node's round workspace, so that a round does not reload what the previous action just had.

Global models are kept decoded by content hash (training, scoring, aggregating and
registering the same round reuse one decode), a scratch module per architecture, and
each dataset's deterministic train / validation split: in the node's memory
(``ctx.memory.workspace``, backend.jobs.driver.memory), which a restart forgets.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import torch

from backend.jobs import blobs
from backend.jobs.config import JobConfig
from backend.jobs.context import NodeContext
from fl_node.codec import decode_model, update_spec
from fl_node.data import ArrayDataset, stratified_split


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
        module = scratch.put(key, config.build_model())
    return module


def spec_of(state) -> dict:
    return update_spec(state)


# The share of a public-hold-out dataset that is its (one, job-independent) hold-out.
PUBLIC_HOLDOUT_FRACTION = 0.2


def split_seed(content_hash: str, config: JobConfig | None) -> int:
    """The validation split depends on the data and the job only, so a restarted node gets the same.

    ``config`` None: the job-independent split of a public hold-out.
    """
    label = "public-holdout" if config is None else config.seed
    digest = hashlib.sha256(f"{content_hash}:{label}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def local_split(ctx: NodeContext, dataset, config: JobConfig) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, validation) parts of this node's dataset: a deterministic stratified split.

    A dataset that declared its hold-out public has ONE hold-out for every job (a fixed
    fraction, seeded by its content alone): its exactly-scored records never change, and are
    never trained on, so the records DP protects stay the same whatever jobs it joins.
    """
    from backend.datasets.services import load_dataset_arrays

    public = bool(getattr(dataset, "public_holdout", False))
    fraction = PUBLIC_HOLDOUT_FRACTION if public else config.val_fraction
    seed = split_seed(dataset.content_hash, None if public else config)
    key = (dataset.content_hash, seed, fraction)
    splits = ctx.memory.workspace.splits
    cached = splits.get(key)
    if cached is not None:
        return cached
    x, y = load_dataset_arrays(dataset)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.int64)
    train_idx, val_idx = stratified_split(y, (1.0 - fraction, fraction), seed=seed)
    if len(val_idx) == 0 or len(train_idx) == 0:
        val_idx, train_idx = np.arange(min(1, len(y))), np.arange(min(1, len(y)), len(y))
    full = ArrayDataset(x, y)
    return splits.put(key, (full.subset(np.sort(train_idx)), full.subset(np.sort(val_idx))))
