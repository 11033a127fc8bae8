"""The jobs app's view of the swarm store: configs, models and updates as blobs, by reference.

Job blobs are stored unencrypted: their references go on chain (public events), so a key
in the reference would protect nothing. The store verifies every chunk against its address,
and callers check the recorded content hash, so a fetched blob is the one the chain names.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from backend.jobs.driver.timing import SWARM, part
from fl_node.codec import content_hash

logger = logging.getLogger(__name__)
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


def get(ctx, reference: str) -> bytes:
    key = _key(reference)
    with _cache_lock:
        data = _cache.get(key)
        if data is not None:
            _cache.move_to_end(key)
            return data
    with part(SWARM):
        data = ctx.swarm.read(key)
    _remember(key, data)
    return data


def prefetch(ctx, reference: str) -> None:
    """Fetch a blob into this process's cache ahead of the action that will read it."""
    try:
        get(ctx, reference)
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


def get_checked(ctx, reference: str, expected_hash: str) -> bytes:
    data = get(ctx, reference)
    if content_hash(data) != expected_hash.removeprefix("0x"):
        raise BlobMismatch(f"blob {reference[:18]}… does not match its recorded hash {expected_hash[:18]}…")
    return data


def unpin_quietly(ctx, reference: str) -> None:
    try:
        ctx.swarm.unpin(reference.removeprefix("0x"))
    except Exception:  # undoing a step: the original error matters more
        pass
