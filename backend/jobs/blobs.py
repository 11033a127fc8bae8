"""The jobs app's view of the swarm store: configs, models and updates as blobs, by reference.

Job blobs are stored unencrypted: their references go on chain (public events), so a key
in the reference would protect nothing. The store verifies every chunk against its address,
and callers check the recorded content hash, so a fetched blob is the one the chain names.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping

from backend.jobs.driver.timing import SWARM, part
from backend.swarm.errors import BlobTooLarge
from fl_node.codec import INDEX_BYTES, content_hash, update_spec

logger = logging.getLogger(__name__)

# Every read names the largest blob it accepts, refused from the blob's root chunk before
# its data is fetched: a reference on chain is written by another member, who may point it
# at a blob of any size (or a tree that claims one).
CONFIG_MAX_BYTES = 64 * 1024  # a job's canonical JSON config
# safetensors header (names, shapes, offsets as JSON) and metadata around the tensors.
CODEC_SLACK_BYTES = 1 << 20
# A read whose caller knows no model spec (a prefetch of an update): the largest model
# this node would train at all.
DEFAULT_MAX_BYTES = 256 << 20
# A global model carries its weights and the server optimiser's state (e.g. FedAdam's
# two moments) of the same shapes: three copies at most.
_MODEL_COPIES = 3


def update_max_bytes(global_state: Mapping) -> int:
    """The largest encoded update of the model whose weights are ``global_state``.

    4 bytes a parameter of the update's spec (float32), plus an 8-byte row id per row of each
    tensor of 2+ dims (a job's sparse policy may send a dense table as a delta array:
    fl_node.sparse), plus the codec's header.
    """
    shapes = update_spec(global_state).values()
    rows = sum(INDEX_BYTES * shape[0] for shape in shapes if len(shape) >= 2)
    return 4 * sum(math.prod(shape) for shape in shapes) + rows + CODEC_SLACK_BYTES


def model_max_bytes(state: Mapping) -> int:
    """The largest encoded global model whose module has the tensors of ``state`` (a state_dict)."""
    weights = sum(t.numel() * t.element_size() for t in state.values())
    return _MODEL_COPIES * weights + CODEC_SLACK_BYTES


# Blobs this process stored or fetched lately, by reference: a round's updates are read by the
# scorer, by every speculating trainer and by the aggregator, and a reference names immutable
# bytes, so one fetch serves them all. Small blobs only (updates, models), bounded in bytes.
CACHE_BYTES = 64 * 2**20
CACHE_BLOB_MAX = 8 * 2**20
_cache: OrderedDict[str, bytes] = OrderedDict()
_cache_size = 0
_cache_lock = threading.Lock()


class BlobMismatch(Exception):
    """A fetched blob does not have the content hash the chain recorded."""


def put(ctx, data: bytes) -> str:
    """Store and pin ``data`` (this node keeps a full copy); returns its 64-hex reference."""
    with part(SWARM):
        reference = str(ctx.swarm.put(data, pin=True))
    _remember(reference, data)
    return reference


def get(ctx, reference: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The blob's bytes if it is at most ``max_bytes`` (else ``BlobTooLarge``, before its data)."""
    key = _key(reference)
    with _cache_lock:
        data = _cache.get(key)
        if data is not None:
            _cache.move_to_end(key)
    if data is not None:
        if len(data) > max_bytes:  # cached by a reader that accepted more
            raise BlobTooLarge(len(data), max_bytes)
        return data
    with part(SWARM):
        data = ctx.swarm.read(key, max_bytes=max_bytes)
    _remember(key, data)
    return data


def prefetch(ctx, reference: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Fetch a blob into this process's cache ahead of the action that will read it."""
    try:
        get(ctx, reference, max_bytes=max_bytes)
    except Exception as exc:  # the action's own read will retry, and report it
        logger.debug("prefetching %s failed: %s", reference[:18], exc)


def cached(reference: str) -> bool:
    with _cache_lock:
        return _key(reference) in _cache


def clear() -> None:
    global _cache_size
    with _cache_lock:
        _cache.clear()
        _cache_size = 0


def _key(reference: str) -> str:
    return reference.removeprefix("0x").lower()


def _remember(reference: str, data: bytes) -> None:
    global _cache_size
    if len(data) > CACHE_BLOB_MAX:
        return
    key = _key(reference)
    with _cache_lock:
        if key in _cache:
            return
        _cache[key] = data
        _cache_size += len(data)
        while _cache_size > CACHE_BYTES:
            _, dropped = _cache.popitem(last=False)
            _cache_size -= len(dropped)


def get_checked(ctx, reference: str, expected_hash: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    data = get(ctx, reference, max_bytes=max_bytes)
    if content_hash(data) != expected_hash.removeprefix("0x"):
        raise BlobMismatch(f"blob {reference[:18]}… does not match its recorded hash {expected_hash[:18]}…")
    return data


def unpin_quietly(ctx, reference: str) -> None:
    try:
        ctx.swarm.unpin(reference.removeprefix("0x"))
    except Exception:  # undoing a step: the original error matters more
        pass
