"""Model bytes from the swarm store, checked against the registered content hash."""

from __future__ import annotations

from backend.api.errors import Conflict
from backend.swarm import factory as swarm_factory
from fl_node.codec import content_hash
from fl_node.models import create_model
from fl_node.sizes import model_max_bytes


def _store():
    return swarm_factory.node_swarm()  # built on first use: building it opens the chunk directory


def store_model_bytes(data: bytes) -> str:
    """Store a global model (plain: its reference is public on chain anyway); returns the reference."""
    return str(_store().put(data, encrypt=False, pin=True))


def max_model_bytes(model) -> int:
    """The most bytes the model's architecture encodes to: a larger blob is refused before its data."""
    module = create_model(
        model.architecture,
        input_shape=tuple(model.input_shape),
        num_classes=model.num_classes,
        **model.options,
    )
    return model_max_bytes(module.state_dict())


def fetch_model_bytes(model) -> bytes:
    data = _store().read(model.reference, max_bytes=max_model_bytes(model))
    if content_hash(data) != model.content_hash:
        # The store verifies chunks against addresses; this catches a wrong reference in the registry.
        raise Conflict(f"the bytes at {model.reference[:16]}… do not match model {model.pk}'s content hash")
    return data
