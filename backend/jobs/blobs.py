"""The jobs app's view of the swarm store: configs, models and updates as blobs, by reference.

Configs and models are stored unencrypted: their references go on chain (public events), so a
key in the reference would protect nothing. Updates are the exception: a trainer stores its
update sealed (backend.jobs.sealed), its key released to the job's participants only after the
round's training deadline, so no member reads another's update while it could still copy it. The
store verifies every chunk against its address, and callers check the recorded content hash
(of the plaintext, for an update), so a fetched blob is the one the chain names.

Memory: an update at full density is as large as its model, hundreds of MB for a large one. A
blob is read from the swarm's stream into one buffer of its exact size (no second copy); one
larger than the cache's blobs comes back as a fresh ``fl_node.codec.OwnedBuffer`` that its caller
owns, which backend.jobs.sealed decrypts in place and fl_node.codec decodes without a copy, so
a round's update is in memory once (tests/jobs/test_blob_memory.py).
"""

from __future__ import annotations

import logging
import threading

from backend.jobs.context import NodeContext
from backend.jobs.driver.timing import SWARM, part
from backend.swarm.errors import BlobTooLarge
from fl_node.codec import OwnedBuffer, content_hash
from fl_node.sizes import CODEC_SLACK_BYTES as CODEC_SLACK_BYTES  # callers read blobs.*
from fl_node.sizes import model_max_bytes as model_max_bytes
from fl_node.sizes import update_max_bytes as update_max_bytes

logger = logging.getLogger(__name__)

# Every read names the largest blob it accepts, refused from the blob's root chunk before
# its data is fetched: a reference on chain is written by another member, who may point it
# at a blob of any size (or a tree that claims one).
CONFIG_MAX_BYTES = 64 * 1024  # a job's canonical JSON config
# A read whose caller knows no model spec (a prefetch of an update): the largest model
# this node would train at all.
DEFAULT_MAX_BYTES = 256 << 20
# Blobs this node stored or fetched lately, by reference: a round's updates are read by the
# scorer, by every speculating trainer and by the aggregator, and a reference names immutable
# bytes, so one fetch serves them all. Small blobs only (updates, models), bounded in bytes. The
# cache is the node's (``ctx.memory.blobs``, backend.jobs.driver.memory), not the process's: what
# a node holds is what it fetched through its own swarm, and a restart (``memory.clear()``)
# starts it empty, as a new process does.
CACHE_BYTES = 64 * 2**20
CACHE_BLOB_MAX = 8 * 2**20


class BlobMismatch(Exception):
    """A fetched blob does not have the content hash the chain recorded."""


def put(ctx: NodeContext, data: bytes) -> str:
    """Store and pin ``data`` (this node keeps a full copy); returns its 64-hex reference."""
    with part(SWARM):
        reference = str(ctx.swarm.put(data, pin=True))
    _remember(ctx, reference, data)
    return reference


def get(ctx: NodeContext, reference: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The blob's bytes if it is at most ``max_bytes`` (else ``BlobTooLarge``, before its data).

    A blob of at most ``CACHE_BLOB_MAX`` bytes is shared through the cache (immutable bytes); a
    larger one is a fresh ``OwnedBuffer`` (a bytearray) of the caller's, never cached.
    """
    key = _key(reference)
    cache = ctx.memory.blobs
    with part(SWARM):  # a wait for another thread's read is a swarm transfer too
        for _ in range(2):
            with cache.lock:
                data = cache.items.get(key)
                if data is not None:
                    cache.items.move_to_end(key)
                    break
                reading = cache.reading.get(key)
                if reading is None:  # nobody reads it: this thread does
                    reading = cache.reading[key] = threading.Event()
                    break
            # Being read (a prefetch started when its event was indexed): waited for, not fetched
            # twice. Once: a read that failed, or a blob too large to keep, is read here after all.
            reading.wait()
            reading = None
        if data is not None:
            if len(data) > max_bytes:  # cached by a reader that accepted more
                raise BlobTooLarge(len(data), max_bytes)
            return data
        try:
            data = _read(ctx.swarm, key, max_bytes)
            _remember(ctx, key, data)
        finally:
            if reading is not None:
                with cache.lock:
                    if cache.reading.get(key) is reading:
                        del cache.reading[key]
                reading.set()
    return data


def _read(swarm, key: str, max_bytes: int) -> bytes | OwnedBuffer:
    """The blob, in one buffer of its exact size (``Swarm.read_buffer``): bytes when the cache
    may hold it, else the ``OwnedBuffer`` itself, handed to the caller."""
    buffer = swarm.read_buffer(key, max_bytes=max_bytes, allocate=OwnedBuffer)
    return bytes(buffer) if len(buffer) <= CACHE_BLOB_MAX else buffer


def prefetch(ctx: NodeContext, reference: str) -> None:
    """Fetch a blob into this node's cache ahead of the action that will read it.

    Only a blob the cache keeps is worth fetching ahead: a larger one is refused from its root
    chunk, before its data, and left to the reader (who knows its bound)."""
    try:
        get(ctx, reference, max_bytes=CACHE_BLOB_MAX)
    except Exception as exc:  # the action's own read will retry, and report it
        logger.debug("prefetching %s failed: %s", reference[:18], exc)


def cached(ctx: NodeContext, reference: str) -> bool:
    cache = ctx.memory.blobs
    with cache.lock:
        return _key(reference) in cache.items


def _key(reference: str) -> str:
    return reference.removeprefix("0x").lower()


def _remember(ctx: NodeContext, reference: str, data: bytes) -> None:
    if len(data) > CACHE_BLOB_MAX:
        return
    data = bytes(data)  # a caller's bytearray stays its own
    key = _key(reference)
    cache = ctx.memory.blobs
    with cache.lock:
        if key in cache.items:
            return
        cache.items[key] = data
        cache.size += len(data)
        while cache.size > CACHE_BYTES:
            _, dropped = cache.items.popitem(last=False)
            cache.size -= len(dropped)


def get_checked(
    ctx: NodeContext, reference: str, expected_hash: str, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> bytes:
    data = get(ctx, reference, max_bytes=max_bytes)
    if content_hash(data) != expected_hash.removeprefix("0x"):
        raise BlobMismatch(f"blob {reference[:18]}… does not match its recorded hash {expected_hash[:18]}…")
    return data


def unpin_quietly(ctx: NodeContext, reference: str) -> None:
    try:
        ctx.swarm.unpin(reference.removeprefix("0x"))
    except Exception:  # undoing a step: the original error matters more
        pass
