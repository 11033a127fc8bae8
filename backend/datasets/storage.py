"""The datasets' view of the swarm store: encrypted put, get, unpin, replication.

Everything that touches the store goes through these functions so that services
never see the store's client or its transport errors (the store raises its own
``SwarmError`` family, which the API maps to HTTP in one place).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from backend.swarm import factory as swarm_factory
from backend.swarm.errors import SwarmError


@dataclass(frozen=True)
class Replication:
    chunks: int
    healthy: int  # chunks that have at least R copies on nodes that answer
    pinned_here: bool  # this node keeps a full copy, safe from its garbage collector


def _store():
    # Built on first use: building the node's swarm opens its chunk directory and needs the node key.
    return swarm_factory.node_swarm()


def store_encrypted(blob: bytes) -> str:
    """Store ``blob`` encrypted and pinned; returns the encrypted reference (which is the data key)."""
    return str(_store().put(blob, encrypt=True, pin=True))


def fetch(reference: str, *, max_bytes: int | None = None) -> bytes:
    """The plaintext of a blob of at most ``max_bytes`` (its registered size; the node's limit if unknown)."""
    from django.conf import settings

    return _store().read(reference, max_bytes=max_bytes or settings.DEFL_SWARM_MAX_BLOB_BYTES)


def discard(reference: str) -> None:
    """Undo ``store_encrypted``: unpin the blob so the store's collector may remove its chunks."""
    _store().unpin(reference)


def root_address(reference: str) -> bytes:
    """The 32-byte root address: the part of a reference that may be published (no key)."""
    return bytes.fromhex(reference[:64])


def replication(reference: str) -> Replication:
    """How well a blob is replicated: one ``has`` request per live node for all its chunks.

    Nodes the swarm currently counts as down are skipped (their copies do not count),
    so a listing never waits on a dead peer's timeout more than once.
    """
    swarm = _store()
    stat = swarm.stat(reference)
    addresses = list(dict.fromkeys(swarm.chunk_addresses(reference)))
    network = swarm.network
    copies: Counter[bytes] = Counter()
    for node in network.nodes:
        if not network.is_up(node):
            continue
        try:
            copies.update(set(node.transport.has(addresses)))
        except SwarmError:
            network.mark_down(node)
    healthy = sum(1 for address in addresses if copies[address] >= network.r)
    return Replication(chunks=len(addresses), healthy=healthy, pinned_here=stat.pinned_here)
