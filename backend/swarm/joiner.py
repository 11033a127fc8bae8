"""Reading a blob back: walk its chunk tree depth-first and stream the leaves in order.

After Bee's pkg/file/joiner. The source returns verified chunks in the order asked and
may prefetch ahead, so memory is bounded by its window, never by the blob.

A tree is not trusted: the chunks are whatever their author wrote, and a hostile one
can list one leaf a million times under a root that claims any span. So the joiner
holds every chunk to the shape the pipeline builds (pipeline.TreeBuilder), which is
fully determined by the blob's length and the chunk size:

- the root's span is the blob's length, and a read that accepts at most ``max_bytes``
  refuses a larger root before it fetches anything else;
- a chunk with span at most the chunk size is a leaf whose payload is exactly its span;
  a larger one is an intermediate chunk of 2..branches children whose spans are the
  canonical ones (``child_spans``: full subtrees, then the rest), and every child's own
  span header must say the same;
- no chunk is larger than the chunk size plus its span header, and the depth is the
  one the span needs (each level's span is strictly smaller than its parent's), with
  ``MAX_DEPTH`` as a last guard.

So the bytes yielded add up to the root's span, and the chunks fetched are about
span / chunk size: a tree that breaks a rule raises ``InvalidTree`` where it breaks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from backend.swarm.chunker import DEFAULT_CHUNK_SIZE
from backend.swarm.crypto import decrypt_chunk
from backend.swarm.errors import BlobTooLarge, InvalidTree
from backend.swarm.reference import ADDRESS_SIZE, SPAN_SIZE, Reference, decode_span, entry_size

# 1 MiB chunks of 32768 children: depth 5 covers 2**80 bytes. Canonical trees never get
# near this; it bounds the recursion should the span rules ever be relaxed.
MAX_DEPTH = 8


class ChunkSource(Protocol):
    def get_many(self, addresses: Sequence[bytes]) -> Iterator[bytes]:
        """Yield the chunks at ``addresses`` in that order, each verified against its address."""
        ...


class _Rules:
    """The shape a tree must have for one chunk size and reference kind."""

    def __init__(self, encrypted: bool, chunk_size: int) -> None:
        self.entry = entry_size(encrypted)
        self.chunk_size = chunk_size
        self.branches = chunk_size // self.entry

    def open(
        self, entry: bytes, data: bytes, expected_span: int | None, depth: int
    ) -> tuple[int, memoryview]:
        """(span, payload) of a chunk, checked against its parent's expectation."""
        if len(data) > SPAN_SIZE + self.chunk_size:
            raise InvalidTree(f"chunk {entry[:ADDRESS_SIZE].hex()} is larger than the chunk size")
        if depth > MAX_DEPTH:
            raise InvalidTree("the chunk tree is deeper than any blob needs")
        key = entry[ADDRESS_SIZE:]
        plain = decrypt_chunk(key, data) if key else data
        view = memoryview(plain)
        try:
            span = decode_span(view)
        except ValueError as exc:
            raise InvalidTree(str(exc)) from None
        if expected_span is not None and span != expected_span:
            raise InvalidTree(f"a chunk spans {span} bytes where its parent says {expected_span}")
        payload = view[SPAN_SIZE:]
        if span <= self.chunk_size and len(payload) != span:
            raise InvalidTree("a leaf's payload is not its span")
        return span, payload

    def children(self, span: int, payload: memoryview) -> list[tuple[bytes, int]]:
        """The (entry, span) of an intermediate chunk's children, in order."""
        if len(payload) % self.entry:
            raise InvalidTree("intermediate chunk has a partial reference")
        count = len(payload) // self.entry
        if not 2 <= count <= self.branches:
            raise InvalidTree(f"an intermediate chunk has {count} children (2..{self.branches} allowed)")
        spans = child_spans(span, count, self.chunk_size, self.branches)
        if spans[-1] <= 0:
            raise InvalidTree(f"{count} children are too many for a span of {span} bytes")
        raw = payload.tobytes()
        return [(raw[i * self.entry : (i + 1) * self.entry], s) for i, s in enumerate(spans)]

    def is_leaf(self, span: int) -> bool:
        return span <= self.chunk_size


def _root(reference: Reference, source: ChunkSource) -> bytes:
    return next(iter(source.get_many([reference.address])))


def join(
    reference: Reference, source: ChunkSource, *, max_bytes: int, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Iterator[memoryview]:
    """Yield the blob's bytes, leaf by leaf; ``BlobTooLarge`` before any data if it exceeds ``max_bytes``.

    The size check happens on the first ``next()``: the root is the only chunk fetched
    before it.
    """
    _, pieces = open_blob(reference, source, max_bytes=max_bytes, chunk_size=chunk_size)
    yield from pieces


def open_blob(
    reference: Reference, source: ChunkSource, *, max_bytes: int, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> tuple[int, Iterator[memoryview]]:
    """Fetch and check the root now: (the blob's length, an iterator over its bytes)."""
    rules = _Rules(reference.encrypted, chunk_size)
    span, payload = rules.open(reference.entry(), _root(reference, source), None, 0)
    if span > max_bytes:
        raise BlobTooLarge(span, max_bytes)
    return span, _join(span, payload, source, rules, 0)


def _join(
    span: int, payload: memoryview, source: ChunkSource, rules: _Rules, depth: int
) -> Iterator[memoryview]:
    if rules.is_leaf(span):
        yield payload
        return
    children = rules.children(span, payload)
    chunks = source.get_many([c[:ADDRESS_SIZE] for c, _ in children])
    for (child, expected), child_data in zip(children, chunks, strict=True):
        child_span, child_payload = rules.open(child, child_data, expected, depth + 1)
        yield from _join(child_span, child_payload, source, rules, depth + 1)


def blob_span(reference: Reference, source: ChunkSource, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """The blob's length, read from its root chunk (whose shape a read checks, not this).

    CTR mode decrypts the span header alone: the key stream starts at the chunk's start.
    """
    data = _root(reference, source)
    if len(data) > SPAN_SIZE + chunk_size:
        raise InvalidTree(f"chunk {reference.address.hex()} is larger than the chunk size")
    head = data[:SPAN_SIZE]
    plain = decrypt_chunk(reference.key, head) if reference.key else head
    try:
        return decode_span(plain)
    except ValueError as exc:
        raise InvalidTree(str(exc)) from None


def child_spans(span: int, count: int, chunk_size: int, branches: int) -> list[int]:
    """Spans of an intermediate chunk's children: all full subtrees but the last one.

    The full subtree size is the one power ``chunk_size * branches**j`` with
    ``(count - 1) * full < span <= count * full`` (see pipeline.TreeBuilder); a last span
    of zero or less means ``count`` children cannot make a canonical tree of ``span``.
    """
    full = chunk_size
    while count * full < span:
        full *= branches
    return [full] * (count - 1) + [span - (count - 1) * full]


def walk(
    reference: Reference, source: ChunkSource, chunk_size: int, *, max_bytes: int | None = None
) -> Iterator[bytes]:
    """Yield the address of every chunk of a blob, fetching only intermediate chunks.

    Leaves are not fetched, so their spans are not checked here (a read checks them);
    the intermediate chunks are held to the same rules as in ``join``.
    """
    rules = _Rules(reference.encrypted, chunk_size)
    yield reference.address
    span, payload = rules.open(reference.entry(), _root(reference, source), None, 0)
    if max_bytes is not None and span > max_bytes:
        raise BlobTooLarge(span, max_bytes)
    yield from _walk(span, payload, source, rules, 0)


def _walk(span: int, payload: memoryview, source: ChunkSource, rules: _Rules, depth: int) -> Iterator[bytes]:
    if rules.is_leaf(span):
        return
    children = rules.children(span, payload)
    inner = [(c, s) for c, s in children if not rules.is_leaf(s)]
    for child, _ in children:
        yield child[:ADDRESS_SIZE]
    fetched = source.get_many([c[:ADDRESS_SIZE] for c, _ in inner])
    for (child, expected), child_data in zip(inner, fetched, strict=True):
        child_span, child_payload = rules.open(child, child_data, expected, depth + 1)
        yield from _walk(child_span, child_payload, source, rules, depth + 1)
