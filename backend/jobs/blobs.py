"""The jobs app's view of the swarm store: configs, models and updates as blobs, by reference.

Job blobs are stored unencrypted: their references go on chain (public events), so a key
in the reference would protect nothing. The store verifies every chunk against its address,
and callers check the recorded content hash, so a fetched blob is the one the chain names.
"""

from __future__ import annotations

from backend.jobs.driver.timing import SWARM, part
from fl_node.codec import content_hash


class BlobMismatch(Exception):
    """A fetched blob does not have the content hash the chain recorded."""


def put(ctx, data: bytes) -> str:
    """Store and pin ``data`` (this node keeps a full copy); returns its 64-hex reference."""
    with part(SWARM):
        return str(ctx.swarm.put(data, pin=True))


def get(ctx, reference: str) -> bytes:
    with part(SWARM):
        return ctx.swarm.read(reference.removeprefix("0x"))


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
