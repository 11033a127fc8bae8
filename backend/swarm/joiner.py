"""Reading a blob back: walk its chunk tree depth-first and stream the leaves in order.

After Bee's pkg/file/joiner. The source returns verified chunks in the order asked and
may prefetch ahead, so memory is bounded by its window, never by the blob. A chunk is a
leaf when its payload is exactly its span (an intermediate chunk's span is always larger
than its payload of references), so joining needs no knowledge of the chunk size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from backend.swarm.crypto import decrypt_chunk
from backend.swarm.reference import ADDRESS_SIZE, SPAN_SIZE, Reference, decode_span, entry_size


class ChunkSource(Protocol):
    def get_many(self, addresses: Sequence[bytes]) -> Iterator[bytes]:
        """Yield the chunks at ``addresses`` in that order, each verified against its address."""
        ...


def _open(entry: bytes, data: bytes) -> tuple[int, memoryview]:
    key = entry[ADDRESS_SIZE:]
    plain = decrypt_chunk(key, data) if key else data
    view = memoryview(plain)
    return decode_span(view), view[SPAN_SIZE:]


def _children(payload: memoryview, size: int) -> list[bytes]:
    if len(payload) % size:
        raise ValueError("intermediate chunk has a partial reference")
    raw = payload.tobytes()
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def join(reference: Reference, source: ChunkSource) -> Iterator[memoryview]:
    """Yield the blob's bytes, leaf by leaf."""
    size = entry_size(reference.encrypted)
    root = reference.entry()
    yield from _join(root, next(iter(source.get_many([reference.address]))), source, size)


def _join(entry: bytes, data: bytes, source: ChunkSource, size: int) -> Iterator[memoryview]:
    span, payload = _open(entry, data)
    if len(payload) == span:
        yield payload
        return
    children = _children(payload, size)
    chunks = source.get_many([c[:ADDRESS_SIZE] for c in children])
    for child, child_data in zip(children, chunks, strict=True):
        yield from _join(child, child_data, source, size)


def blob_span(reference: Reference, source: ChunkSource) -> int:
    """The blob's length, read from its root chunk."""
    data = next(iter(source.get_many([reference.address])))
    return _open(reference.entry(), data)[0]


def child_spans(span: int, count: int, chunk_size: int, branches: int) -> list[int]:
    """Spans of an intermediate chunk's children: all full subtrees but the last one.

    The full subtree size is the one power ``chunk_size * branches**j`` with
    ``(count - 1) * full < span <= count * full`` (see pipeline.TreeBuilder).
    """
    full = chunk_size
    while count * full < span:
        full *= branches
    return [full] * (count - 1) + [span - (count - 1) * full]


def walk(reference: Reference, source: ChunkSource, chunk_size: int) -> Iterator[bytes]:
    """Yield the address of every chunk of a blob, fetching only intermediate chunks."""
    size = entry_size(reference.encrypted)
    yield reference.address
    data = next(iter(source.get_many([reference.address])))
    yield from _walk(reference.entry(), data, source, size, chunk_size)


def _walk(entry: bytes, data: bytes, source: ChunkSource, size: int, chunk_size: int) -> Iterator[bytes]:
    span, payload = _open(entry, data)
    if len(payload) == span:
        return
    children = _children(payload, size)
    spans = child_spans(span, len(children), chunk_size, chunk_size // size)
    inner = [c for c, s in zip(children, spans, strict=True) if s > chunk_size]
    for child in children:
        yield child[:ADDRESS_SIZE]
    fetched = source.get_many([c[:ADDRESS_SIZE] for c in inner])
    for child, child_data in zip(inner, fetched, strict=True):
        yield from _walk(child, child_data, source, size, chunk_size)
