"""Model bytes from the swarm store, checked against the registered content hash."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

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


class ModelMismatch(Exception):
    """A streamed model's bytes did not hash to its registered content hash (raised at its end)."""


def model_size(model) -> int:
    """The model blob's size, read from its root chunk (BlobTooLarge above the architecture's bound)."""
    return _store().stat(model.reference, max_bytes=max_model_bytes(model)).size


def stream_model_bytes(model) -> Iterator[bytes]:
    """The model's bytes a piece at a time (never the whole model in memory), hashed on the way.

    The store verifies every chunk against its address; should the registry's reference name other
    bytes than its content hash, the last piece is withheld and ModelMismatch raised, so a client
    that was promised Content-Length bytes never receives a complete wrong file.
    """
    digest = hashlib.sha256()
    pending: bytes | None = None
    for piece in _store().open(model.reference, max_bytes=max_model_bytes(model)):
        if pending is not None:
            yield pending
        pending = bytes(piece)
        digest.update(pending)
    if digest.hexdigest() != model.content_hash:
        raise ModelMismatch(
            f"the bytes at {model.reference[:16]}… do not match model {model.pk}'s content hash"
        )
    if pending is not None:
        yield pending
