"""The binary bodies of the peer API: address lists and framed chunk batches.

A batch is a sequence of ``address (32 bytes) || length (4 bytes, big endian) || data``;
a list of address lists (a scrub's answer) is ``count (4 bytes) || addresses`` per list.
Free of I/O, so the client, the views and the tests share it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence

from backend.swarm.reference import ADDRESS_SIZE

_LEN = struct.Struct(">I")
_HEADER = ADDRESS_SIZE + _LEN.size


def encode_batch(chunks: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"".join(BatchBody(chunks))


class BatchBody:
    """A batch as the pieces of its body (frame headers and the chunks' own buffers).

    Iterating yields the pieces ``encode_batch`` joins, and ``len()`` is the body's
    length, so an HTTP client sends it with a Content-Length, piece by piece, without
    first copying megabytes of chunks into one body.
    """

    def __init__(self, chunks: Iterable[tuple[bytes, bytes | memoryview]]) -> None:
        self.chunks = list(chunks)
        self.headers = [address + _LEN.pack(len(data)) for address, data in self.chunks]
        self.size = sum(_HEADER + len(data) for _, data in self.chunks)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes | memoryview]:
        for header, (_, data) in zip(self.headers, self.chunks, strict=True):
            yield header
            yield data

    def digest(self) -> str:
        """``batch_digest`` of the encoded body, from the headers alone."""
        h = hashlib.sha256()
        for header in self.headers:
            h.update(header)
        return h.hexdigest()


def decode_batch(body: bytes | memoryview) -> Iterator[tuple[bytes, memoryview]]:
    view = memoryview(body)
    offset = 0
    while offset < len(view):
        if offset + _HEADER > len(view):
            raise ValueError("truncated chunk header")
        address = view[offset : offset + ADDRESS_SIZE].tobytes()
        (length,) = _LEN.unpack_from(view, offset + ADDRESS_SIZE)
        start = offset + _HEADER
        if start + length > len(view):
            raise ValueError("truncated chunk data")
        yield address, view[start : start + length]
        offset = start + length


def encode_addresses(addresses: Sequence[bytes]) -> bytes:
    return b"".join(addresses)


def decode_addresses(body: bytes | memoryview) -> list[bytes]:
    raw = bytes(body)
    if len(raw) % ADDRESS_SIZE:
        raise ValueError("address list is not a multiple of 32 bytes")
    return [raw[i : i + ADDRESS_SIZE] for i in range(0, len(raw), ADDRESS_SIZE)]


def encode_address_lists(lists: Sequence[Sequence[bytes]]) -> bytes:
    return b"".join(_LEN.pack(len(addresses)) + b"".join(addresses) for addresses in lists)


def decode_address_lists(body: bytes | memoryview) -> list[list[bytes]]:
    raw = bytes(body)
    lists, offset = [], 0
    while offset < len(raw):
        if offset + _LEN.size > len(raw):
            raise ValueError("truncated address list header")
        (count,) = _LEN.unpack_from(raw, offset)
        start, offset = offset + _LEN.size, offset + _LEN.size + count * ADDRESS_SIZE
        if offset > len(raw):
            raise ValueError("truncated address list")
        lists.append([raw[i : i + ADDRESS_SIZE] for i in range(start, offset, ADDRESS_SIZE)])
    return lists


def batch_digest(body: bytes | memoryview) -> str:
    """The signed hash of a batch: SHA-256 over its frame headers only (see signing.py).

    Raises ``ValueError`` for a malformed batch, so a truncated body fails the signature.
    """
    h = hashlib.sha256()
    view = memoryview(body)
    for address, data in decode_batch(view):
        h.update(address + _LEN.pack(len(data)))
    return h.hexdigest()
