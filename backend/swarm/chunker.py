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
    def split(self, stream: BinaryIO, headroom: int = 0) -> Iterator[bytearray]:
        """Yield the pieces of ``stream`` in order; an empty stream yields one empty piece.

        Each piece comes after ``headroom`` free bytes of its buffer, which the caller
        fills with a frame header (the chunk's span), so framing a piece costs no copy.
        """
        ...


class FixedSizeSplitter:
    """Cuts a stream into pieces of exactly ``size`` bytes (the last one may be shorter)."""

    def __init__(self, size: int = DEFAULT_CHUNK_SIZE) -> None:
        if size <= 0:
            raise ValueError("chunk size must be positive")
        self.size = size

    def split(self, stream: BinaryIO, headroom: int = 0) -> Iterator[bytearray]:
        first = True
        while True:
            piece = read_full(stream, self.size, headroom)
            length = len(piece) - headroom
            if length or first:
                # An empty blob still has a root chunk, so it has a reference like any other.
                yield piece
            first = False
            if length < self.size:
                return


def read_full(stream: BinaryIO, size: int, headroom: int = 0) -> bytearray:
    """Read ``size`` bytes unless the stream ends first (pipes and sockets return short reads).

    The bytes land after ``headroom`` free bytes; a stream with ``readinto`` (files,
    sockets) reads straight into the buffer, others are copied in.
    """
    buf = bytearray(headroom + size)
    got = 0
    readinto = getattr(stream, "readinto", None)
    with memoryview(buf) as view:
        while got < size:
            if readinto is not None:
                try:
                    with view[headroom + got :] as target:
                        n = readinto(target) or 0
                except NotImplementedError:  # an io.RawIOBase that implements only read()
                    readinto = None
                    continue
            else:
                data = stream.read(size - got) or b""
                n = len(data)
                view[headroom + got : headroom + got + n] = data
            if not n:
                break
            got += n
    if got < size:
        del buf[headroom + got :]
    return buf
