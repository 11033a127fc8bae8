"""Model bytes from the swarm store, checked against the registered content hash."""

from __future__ import annotations

from backend.api.errors import Conflict
from fl_node.codec import content_hash


def _store():
    from backend.swarm.factory import node_swarm  # late: building it opens the chunk directory

    return node_swarm()


def store_model_bytes(data: bytes) -> str:
    """Store a global model (plain: its reference is public on chain anyway); returns the reference."""
    return str(_store().put(data, encrypt=False, pin=True))


def fetch_model_bytes(model) -> bytes:
    data = _store().read(model.reference)
    if content_hash(data) != model.content_hash:
        # The store verifies chunks against addresses; this catches a wrong reference in the registry.
        raise Conflict(f"the bytes at {model.reference[:16]}… do not match model {model.pk}'s content hash")
    return data
