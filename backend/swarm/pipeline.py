"""Storing a blob: a chain of single-purpose stages, each given the next one.

After Bee's pkg/file/pipeline: split -> frame -> [encrypt] -> hash -> put, with the
chunk tree built by ``TreeBuilder``, which sends intermediate chunks down the same
chain. Encryption comes before hashing because an address is the hash of the stored
(cipher)text. No stage knows what comes after its ``next``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO, NamedTuple, Protocol

from backend.swarm.chunker import DEFAULT_CHUNK_SIZE, FixedSizeSplitter, Splitter
from backend.swarm.crypto import encrypt_chunk, new_chunk_key
from backend.swarm.reference import SPAN_SIZE, Reference, chunk_address, encode_span, entry_size

Progress = Callable[[int], None]
"""Called with the number of blob bytes processed so far."""


class ChunkSink(Protocol):
    """The last stage: somewhere chunks go (the local store, the network, a list in a test)."""

    def put(self, address: bytes, data: bytes) -> None: ...


class Sealed(NamedTuple):
    """A chunk ready to store: its reference entry, its address and the bytes as stored."""

    entry: bytes
    address: bytes
    data: bytes


class ChunkWriter(Protocol):
    """A stage that takes a framed chunk (span || payload) and returns its reference entry.

    ``seal`` is pure (encrypt, hash: both release the GIL), so several chunks can be
    sealed at once on other threads; ``store`` hands a sealed chunk on, in order.
    """

    def seal(self, chunk: bytes) -> Sealed: ...

    def store(self, sealed: Sealed) -> bytes: ...

    def write(self, chunk: bytes) -> bytes: ...


class HashStage:
    """Addresses a chunk by the hash of its bytes and hands both to the sink."""

    def __init__(self, sink: ChunkSink) -> None:
        self.sink = sink

    def seal(self, chunk: bytes) -> Sealed:
        address = chunk_address(chunk)
        return Sealed(address, address, chunk)

    def store(self, sealed: Sealed) -> bytes:
        self.sink.put(sealed.address, sealed.data)
        return sealed.entry

    def write(self, chunk: bytes) -> bytes:
        return self.store(self.seal(chunk))


class EncryptStage:
    """Encrypts a chunk with a fresh key; the entry it returns is the address plus that key."""

    def __init__(self, next_stage: ChunkWriter) -> None:
        self.next = next_stage

    def seal(self, chunk: bytes) -> Sealed:
        key = new_chunk_key()
        sealed = self.next.seal(encrypt_chunk(key, chunk))
        return sealed._replace(entry=sealed.entry + key)

    def store(self, sealed: Sealed) -> bytes:
        return self.next.store(sealed)

    def write(self, chunk: bytes) -> bytes:
        return self.store(self.seal(chunk))


class TreeBuilder:
    """Packs child entries into intermediate chunks, level by level, as leaves stream in.

    Only one partial level list is held per tree level, so memory does not grow with
    the blob. The shape is canonical (same bytes, same tree): full levels are packed as
    soon as they fill, and at the end a level holding one entry is carried up instead
    of being wrapped, so every intermediate chunk has at least two children and all but
    its last child are full subtrees.
    """

    def __init__(self, writer: ChunkWriter, branches: int) -> None:
        if branches < 2:
            raise ValueError("an intermediate chunk needs room for two children")
        self.writer = writer
        self.branches = branches
        self.levels: list[list[tuple[bytes, int]]] = [[]]

    def add(self, entry: bytes, span: int, level: int = 0) -> None:
        while len(self.levels) <= level:
            self.levels.append([])
        self.levels[level].append((entry, span))
        if len(self.levels[level]) == self.branches:
            self._pack(level)

    def _pack(self, level: int) -> None:
        children = self.levels[level]
        self.levels[level] = []
        span = sum(s for _, s in children)
        chunk = encode_span(span) + b"".join(e for e, _ in children)
        self.add(self.writer.write(chunk), span, level + 1)

    def finish(self) -> bytes:
        level = 0
        while True:
            entries = self.levels[level]
            higher = any(self.levels[level + 1 :])
            if not higher:
                if len(entries) == 1:
                    return entries[0][0]
                if not entries:
                    raise ValueError("no chunks were written")
            if len(entries) == 1:
                self.levels[level] = []
                self.add(entries[0][0], entries[0][1], level + 1)
            elif entries:
                self._pack(level)
            level += 1


def build_writer(sink: ChunkSink, *, encrypt: bool) -> ChunkWriter:
    hashed: ChunkWriter = HashStage(sink)
    return EncryptStage(hashed) if encrypt else hashed


def store_stream(
    stream: BinaryIO,
    sink: ChunkSink,
    *,
    encrypt: bool = False,
    splitter: Splitter | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress: Progress | None = None,
    seal_threads: int = 2,
    seal_ahead: int = 4,
) -> Reference:
    """Split, (encrypt,) hash and put every chunk of ``stream``; return the blob's reference.

    Leaves are sealed (encrypted, hashed) on ``seal_threads`` threads up to ``seal_ahead``
    chunks ahead while this thread reads the next pieces; they reach the sink and the
    tree in blob order, so the tree (and the reference) is the same as sealing one by one.
    """
    splitter = splitter or FixedSizeSplitter(chunk_size)
    writer = build_writer(sink, encrypt=encrypt)
    tree = TreeBuilder(writer, chunk_size // entry_size(encrypt))
    done = 0
    ahead: deque[tuple[int, Future[Sealed]]] = deque()

    def store_next() -> None:
        nonlocal done
        span, sealing = ahead.popleft()
        tree.add(writer.store(sealing.result()), span)
        done += span
        if progress:
            progress(done)

    with ThreadPoolExecutor(max_workers=seal_threads, thread_name_prefix="seal") as pool:
        try:
            for framed in splitter.split(stream, headroom=SPAN_SIZE):
                span = len(framed) - SPAN_SIZE
                if span > chunk_size:
                    raise ValueError("the splitter returned a piece larger than the chunk size")
                framed[:SPAN_SIZE] = encode_span(span)
                ahead.append((span, pool.submit(writer.seal, framed)))
                if len(ahead) > seal_ahead:
                    store_next()
            while ahead:
                store_next()
        finally:
            for _, sealing in ahead:
                sealing.cancel()
    return Reference.from_entry(tree.finish())
