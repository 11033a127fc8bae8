"""Splitting a byte stream into fixed-size pieces: the tiny splitter interface of the store.

After boxo's chunker/splitting.go: a splitter only cuts bytes; hashing, encryption and
storage are later stages of the pipeline (pipeline.py) and know nothing about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, Protocol

# 1 MiB: see bench/swarm.py --chunk-sizes. Small chunks (Swarm's 4 KiB) cost one file,
# one fsync and one index row each, which caps a node at ~12 MB/s here; from 256 KiB up
# the store runs at disk speed and 1 MiB halves the per-chunk overhead again.
DEFAULT_CHUNK_SIZE = 1 << 20


class Splitter(Protocol):
    def split(self, stream: BinaryIO) -> Iterator[bytes]:
        """Yield the pieces of ``stream`` in order; an empty stream yields one empty piece."""
        ...


class FixedSizeSplitter:
    """Cuts a stream into pieces of exactly ``size`` bytes (the last one may be shorter)."""

    def __init__(self, size: int = DEFAULT_CHUNK_SIZE) -> None:
        if size <= 0:
            raise ValueError("chunk size must be positive")
        self.size = size

    def split(self, stream: BinaryIO) -> Iterator[bytes]:
        first = True
        while True:
            piece = read_full(stream, self.size)
            if piece or first:
                # An empty blob still has a root chunk, so it has a reference like any other.
                yield piece
            first = False
            if len(piece) < self.size:
                return


def read_full(stream: BinaryIO, size: int) -> bytes:
    """Read ``size`` bytes unless the stream ends first: pipes and sockets return short reads."""
    data = stream.read(size)
    if data is None:
        data = b""
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = stream.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
