"""The Python API of the store: put, get, pin, unpin, stat, repair, gc.

``Swarm`` composes the pieces (pipeline, network sink, network source, joiner, local
store) and takes everything as arguments; ``backend.swarm.factory`` builds the node's
instance from the settings.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from backend.swarm.chunker import DEFAULT_CHUNK_SIZE
from backend.swarm.download import FetchStats, NetworkSource
from backend.swarm.errors import InvalidTree
from backend.swarm.joiner import blob_span, join, open_blob, walk
from backend.swarm.network import Network
from backend.swarm.pipeline import Progress, store_stream
from backend.swarm.reference import Reference
from backend.swarm.repair import RepairReport, repair_chunks, repair_node
from backend.swarm.store import ChunkStore, GcResult, StoreUsage
from backend.swarm.upload import LocalCopySink, ReplicatingSink

# Bytes or an open binary stream, never a path: a string reaching `put` from a request must not
# make the node read one of its own files (a multipart field without a filename is a str).
Source = BinaryIO | bytes | bytearray | memoryview


@dataclass(frozen=True)
class BlobStat:
    reference: str
    size: int
    chunks: int
    encrypted: bool
    pinned_here: bool


@dataclass(frozen=True)
class NodeStat:
    address: str
    replication: int
    nodes: list[dict[str, object]]
    usage: StoreUsage


@dataclass(frozen=True)
class RefillReport:
    missing: int  # indexed chunks whose file was not here
    fetched: int  # of those, fetched back from peers (verified) and stored
    unavailable: int  # no live peer had them: left to the peers' scheduled repairs


class Swarm:
    def __init__(
        self,
        store: ChunkStore,
        network: Network,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        batch_bytes: int = 8 << 20,
        max_inflight_bytes: int = 48 << 20,
    ) -> None:
        self.store = store
        self.network = network
        self.chunk_size = chunk_size
        self.batch_bytes = batch_bytes
        self.max_inflight_bytes = max_inflight_bytes
        self.last_fetch_stats = FetchStats()

    @property
    def address(self) -> str:
        return next(n.peer.address for n in self.network.nodes if n.local)

    # --- put / get -------------------------------------------------------------------------
    def put(
        self, source: Source, *, encrypt: bool = False, pin: bool = False, progress: Progress | None = None
    ) -> Reference:
        """Store a blob on the network (each chunk on its R closest nodes) and return its reference."""
        self.network.refresh()
        sink = ReplicatingSink(
            self.network, batch_bytes=self.batch_bytes, max_inflight_bytes=self.max_inflight_bytes
        )
        # Pinned: a copy of every chunk is kept here as it is made (LocalCopySink), and the tree's
        # chunks are pinned as the put wrote them, with no walk over the network.
        writes = LocalCopySink(sink, self.store, self.network) if pin else sink
        with _open_source(source) as stream:
            reference = store_stream(
                stream, writes, encrypt=encrypt, chunk_size=self.chunk_size, progress=progress
            )
        sink.close()
        if isinstance(writes, LocalCopySink):
            self.store.pin(writes.addresses)
        return reference

    def open(self, reference: Reference | str, *, max_bytes: int) -> Iterator[memoryview]:
        """Stream a blob's bytes; every chunk is verified and bad copies are repaired on the way.

        A blob larger than ``max_bytes`` raises ``BlobTooLarge`` on the first ``next()``,
        after its root chunk and before any other; a malformed tree raises ``InvalidTree``.
        """
        self.network.refresh()
        source = NetworkSource(self.network)
        self.last_fetch_stats = source.stats
        return join(_ref(reference), source, max_bytes=max_bytes, chunk_size=self.chunk_size)

    def get(
        self,
        reference: Reference | str,
        out: BinaryIO | str | os.PathLike[str],
        *,
        max_bytes: int,
        progress: Progress | None = None,
    ) -> int:
        """Write a blob of at most ``max_bytes`` to a file or stream; return its size."""
        if isinstance(out, str | os.PathLike):
            with open(out, "wb") as f:
                return self.get(reference, f, max_bytes=max_bytes, progress=progress)
        done = 0
        with _Writeback.of(out) as writeback:
            for piece in self.open(reference, max_bytes=max_bytes):
                out.write(piece)
                done += len(piece)
                writeback.wrote(len(piece))
                if progress:
                    progress(done)
        return done

    def read(self, reference: Reference | str, *, max_bytes: int) -> bytes:
        """A whole (small) blob in memory: at most ``max_bytes``, or ``BlobTooLarge`` before its data."""
        return bytes(self.read_buffer(reference, max_bytes=max_bytes))

    def read_buffer(
        self, reference: Reference | str, *, max_bytes: int, allocate: Callable[[int], bytearray] = bytearray
    ) -> bytearray:
        """A whole blob in one buffer of its exact size, ``allocate(size)`` (a bytearray or a subclass
        of it, which the caller then owns): at most ``max_bytes``, or ``BlobTooLarge`` before its data.

        The buffer is allocated once the root's span is known to be in bounds; the joiner's span
        rules guarantee the leaves fill exactly that, so the blob is in memory once.
        """
        self.network.refresh()
        source = NetworkSource(self.network)
        self.last_fetch_stats = source.stats
        size, pieces = open_blob(_ref(reference), source, max_bytes=max_bytes, chunk_size=self.chunk_size)
        buffer = allocate(size)
        done = 0
        with memoryview(buffer) as view:
            for piece in pieces:
                if done + len(piece) > size:
                    raise InvalidTree("the leaves hold more bytes than the root's span")
                view[done : done + len(piece)] = piece
                done += len(piece)
        if done != size:
            raise InvalidTree("the leaves hold fewer bytes than the root's span")
        return buffer

    # --- pins ----------------------------------------------------------------------------
    def chunk_addresses(self, reference: Reference | str, *, max_bytes: int | None = None) -> list[bytes]:
        self.network.refresh()
        return list(walk(_ref(reference), NetworkSource(self.network), self.chunk_size, max_bytes=max_bytes))

    def pin(self, reference: Reference | str, *, progress: Callable[[int], None] | None = None) -> int:
        """Keep a full copy of the blob in this node's store, safe from gc; returns its chunk count."""
        addresses = self.chunk_addresses(reference)
        wanted = [a for a in dict.fromkeys(addresses) if not self.store.has(a)]
        source = NetworkSource(self.network)
        done = len(addresses) - len(wanted)
        for i in range(0, len(wanted), 16):
            group = wanted[i : i + 16]
            self.store.put_many(list(zip(group, source.get_many(group), strict=True)))
            done += len(group)
            if progress:
                progress(done)
        self.store.pin(addresses)
        return len(addresses)

    def unpin(self, reference: Reference | str) -> None:
        self.store.unpin(self.chunk_addresses(reference))

    # --- stat / maintenance ----------------------------------------------------------------
    def stat(self, reference: Reference | str, *, max_bytes: int | None = None) -> BlobStat:
        """Size and chunk count; with ``max_bytes`` a larger blob is refused from its root."""
        ref = _ref(reference)
        addresses = self.chunk_addresses(ref, max_bytes=max_bytes)
        return BlobStat(
            reference=str(ref),
            size=blob_span(ref, NetworkSource(self.network), chunk_size=self.chunk_size),
            chunks=len(addresses),
            encrypted=ref.encrypted,
            pinned_here=self.store.pins(ref.address) > 0,
        )

    def node_stat(self) -> NodeStat:
        self.network.refresh()
        return NodeStat(
            address=self.address,
            replication=self.network.r,
            nodes=[
                {"address": n.peer.address, "url": n.peer.url, "local": n.local, "up": self.network.is_up(n)}
                for n in self.network.nodes
            ],
            usage=self.store.usage(),
        )

    def refill(self, *, batch: int = 64, progress: Callable[[int], None] | None = None) -> RefillReport:
        """Fetch back from peers every chunk the index lists but the disk lacks (after a restore
        whose backup had no chunks); what no live peer has stays missing, for the repairs."""
        from backend.swarm.errors import ChunkNotFound

        missing = self.store.missing()
        self.network.refresh()
        source = NetworkSource(self.network, repair=False)
        fetched = 0
        for start in range(0, len(missing), batch):
            for address in missing[start : start + batch]:
                try:
                    data = source.fetch_batch([address])[address]
                except ChunkNotFound:
                    continue
                fetched += len(self.store.put_many([(address, data)]))
            if progress:
                progress(min(start + batch, len(missing)))
        return RefillReport(missing=len(missing), fetched=fetched, unavailable=len(missing) - fetched)

    def repair(
        self,
        reference: Reference | str | None = None,
        *,
        verify: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> RepairReport:
        """Repair one blob's chunks, or (no reference) everything this node holds.

        With ``verify`` every responsible node re-hashes its copies (corrupt ones are
        replaced); without, copies are only checked to exist.
        """
        self.network.refresh()
        if reference is None:
            return repair_node(self.network, self.store, verify=verify, progress=progress)
        return repair_chunks(self.network, self.chunk_addresses(reference), verify=verify, progress=progress)

    def gc(self, *, grace_s: float = 3600.0) -> GcResult:
        """Drop unpinned chunks this node is not responsible for (not one of their R closest)."""
        self.network.refresh()
        me = self.address

        def responsible(address: bytes) -> bool:
            return any(n.peer.address == me for n in self.network.ranked(address)[: self.network.r])

        return self.store.gc(responsible, grace_s=grace_s)

    def close(self) -> None:
        self.network.close()


class _Writeback:
    """Has a file being downloaded written to disk as it grows, by fdatasync on a helper thread.

    Otherwise the kernel holds the whole blob as dirty pages until the caller's fsync,
    which then waits for all of it at once: the disk idles while the chunks arrive and
    everything else waits while the disk writes. Syncing what has arrived so far, one
    sync at a time, overlaps the two, and leaves the caller's fsync only the tail. A
    sync error is raised (the data is not on disk; a later fsync may not say so again).
    """

    every = 8 << 20

    def __init__(self, out: BinaryIO, fd: int | None) -> None:
        self.out = out
        self.fd = fd
        self.pending = 0
        self._pool: ThreadPoolExecutor | None = None
        self._syncing: Future[None] | None = None

    @classmethod
    def of(cls, out: BinaryIO) -> _Writeback:
        try:
            fd = out.fileno()
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except (AttributeError, OSError, ValueError):  # not a real file (a socket, BytesIO)
            return cls(out, None)
        return cls(out, fd if regular else None)

    def __enter__(self) -> _Writeback:
        return self

    def wrote(self, size: int) -> None:
        if self.fd is None:
            return
        self.pending += size
        if self.pending < self.every or (self._syncing is not None and not self._syncing.done()):
            return
        self._wait()
        self.pending = 0
        self.out.flush()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writeback")
        self._syncing = self._pool.submit(os.fdatasync, self.fd)

    def _wait(self) -> None:
        if self._syncing is not None:
            syncing, self._syncing = self._syncing, None
            syncing.result()

    def __exit__(self, *exc: object) -> None:
        # The caller may close the file as soon as get() returns: no sync may outlive it.
        try:
            self._wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()


def _ref(reference: Reference | str) -> Reference:
    return reference if isinstance(reference, Reference) else Reference.parse(reference)


class _open_source:
    """A context manager giving a binary stream for bytes or an open binary stream.

    Anything else (a ``str``, a path) is refused with ``TypeError``: paths are opened by the
    caller that owns them (the ``swarm put`` command, a benchmark), never here.
    """

    def __init__(self, source: Source) -> None:
        self.source = source

    def __enter__(self) -> BinaryIO:
        if isinstance(self.source, bytes | bytearray | memoryview):
            return io.BytesIO(self.source)
        if isinstance(self.source, str | os.PathLike) or not callable(getattr(self.source, "read", None)):
            raise TypeError(f"a blob is bytes or a binary stream, not {type(self.source).__name__}")
        return self.source

    def __exit__(self, *exc: object) -> None:
        return None


def backup_store(store: ChunkStore, directory: Path, *, with_chunks: bool = False) -> int:
    """Copy the chunk index (a consistent snapshot) into ``directory``, and with ``with_chunks``
    every chunk file under ``directory/chunks``; returns the chunks copied."""
    directory.mkdir(parents=True, exist_ok=True)
    store.backup_index(directory / "index.sqlite3")
    copied = 0
    if with_chunks:
        for address in store.addresses():  # chunk files never change: each copy is whole
            target = directory / "chunks" / address.hex()[:2] / address.hex()
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(store.path(address), target)
            except FileNotFoundError:  # collected meanwhile: a peer holds it
                continue
            copied += 1
    return copied


def restore_store(store: ChunkStore, directory: Path) -> None:
    """Put back a backup's index and chunks (``backup``): the node's processes are stopped."""
    root = store.root
    for suffix in ("", "-wal", "-shm"):
        (root / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    shutil.copyfile(directory / "index.sqlite3", root / "index.sqlite3")
    saved = directory / "chunks"
    if saved.is_dir():
        for file in saved.rglob("*"):
            target = root / file.relative_to(saved)
            if file.is_file() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, target)
