"""One exception family for the swarm store.

Each class says what it means to an API caller in ``http_status`` (a plain int: the store does not
know DRF); backend/api/exception_handler.py reads it. "Cannot be served now" is 503, a chunk every
node asked says it does not hold 404, a caller's malformed input 400, a blob over its bound 413,
the rest conflicts with the stored state: 409.
"""

from __future__ import annotations


class SwarmError(Exception):
    """Base of every error the swarm store raises."""

    http_status = 409


class InvalidReference(SwarmError, ValueError):
    """A reference string is not 64 (plain) or 128 (encrypted) hex characters."""

    http_status = 400


class ChunkNotFound(SwarmError):
    """No reachable node returned a valid copy of a chunk."""

    http_status = 503

    def __init__(self, address: bytes, detail: str = "") -> None:
        super().__init__(f"chunk {address.hex()} not found{': ' + detail if detail else ''}")
        self.address = address


class ChunkMissing(ChunkNotFound):
    """Every node asked answered, and none holds the chunk: it is not in the store (a 404, where a
    node that could not be asked leaves it possibly there: ChunkNotFound, a 503)."""

    http_status = 404


class CorruptChunk(SwarmError):
    """A chunk's content does not hash to its address."""

    def __init__(self, address: bytes) -> None:
        super().__init__(f"chunk {address.hex()} is corrupt")
        self.address = address


class SwarmUnavailable(SwarmError):
    """Not enough of the network answered."""

    http_status = 503


class NotEnoughReplicas(SwarmUnavailable):
    """An upload could not place the required number of copies of every chunk."""


class PeerError(SwarmUnavailable):
    """A peer could not be reached or answered with an error (transport errors end here)."""


class BlobTooLarge(SwarmError):
    """A blob is larger than the reader accepts (refused from its root chunk, before its data)."""

    http_status = 413

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the blob is {size} bytes, more than the {limit} bytes this read accepts")
        self.size = size
        self.limit = limit


class InvalidTree(SwarmError):
    """A blob's chunk tree breaks the tree rules (spans that do not add up, too deep, too wide)."""
