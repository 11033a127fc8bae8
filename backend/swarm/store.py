"""A node's local chunk store: one file per chunk plus a small SQLite index.

Files are the truth for data: a chunk is written to a temporary file, fsynced, renamed
into place and its directory fsynced, so a crash leaves either the whole chunk or none.
Every read is verified against the address; a corrupt file is moved aside (so the node
answers "missing" and repair can bring a good copy back). The index holds sizes, pin
counts (a chunk shared by several pinned blobs counts each pin) and store times, which
gives usage figures without walking the directory and lets gc find unpinned chunks.
"""

from __future__ import annotations

import mmap
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from backend.swarm.errors import ChunkNotFound, CorruptChunk
from backend.swarm.reference import ADDRESS_SIZE, is_valid_chunk

# Bulk writes (a batch of at least DIRECT_BATCH_BYTES: a replicated upload's batches are
# 8 MiB) have their full-size chunks' whole pages written with O_DIRECT (``_write_direct``).
# Small blobs (a round's updates and models of a few MB), intermediate chunks and a blob's
# tail go through the page cache: they are read back soon after.
DIRECT_MIN_BYTES = 1 << 20
DIRECT_BATCH_BYTES = 4 << 20
_PAGE = mmap.PAGESIZE
_O_DIRECT = getattr(os, "O_DIRECT", 0)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    address BLOB PRIMARY KEY,
    size INTEGER NOT NULL,
    pins INTEGER NOT NULL DEFAULT 0,
    stored_at REAL NOT NULL
) WITHOUT ROWID;
"""


INDEX_LOCK_TIMEOUT_S = 30.0


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Put the index in WAL mode, waiting out a concurrent switch.

    SQLite answers "database is locked" at once, without its busy handler, when two
    connections switch a fresh file's journal mode together (a new node's first requests on
    several threads, or the agent and a web worker starting side by side), so the wait is
    here. Once the file is in WAL mode (it stays so) the pragma takes no lock.
    """
    deadline = time.monotonic() + INDEX_LOCK_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@dataclass(frozen=True)
class StoreUsage:
    chunks: int
    bytes: int
    pinned_chunks: int
    pinned_bytes: int


@dataclass(frozen=True)
class GcResult:
    removed_chunks: int
    removed_bytes: int


class ChunkStore:
    def __init__(self, root: str | Path, *, fsync: bool = True, io_threads: int = 16) -> None:
        self.root = Path(root)
        self._io = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="chunk-io")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "corrupt").mkdir(exist_ok=True)
        self.fsync = fsync
        self._dirs: set[Path] = set()
        self._direct = bool(_O_DIRECT)  # cleared for good where the filesystem refuses it (tmpfs)
        self._aligned = threading.local()  # one page-aligned buffer per I/O thread
        self._local = threading.local()
        with self._db() as db:
            db.execute(_SCHEMA)

    # --- index -------------------------------------------------------------------------
    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # One connection per thread (gunicorn serves requests on several threads);
        # WAL lets the node process and a management command share the index.
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.root / "index.sqlite3", timeout=INDEX_LOCK_TIMEOUT_S, isolation_level=None
            )
            _enable_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- paths ---------------------------------------------------------------------------
    def path(self, address: bytes) -> Path:
        if len(address) != ADDRESS_SIZE:
            raise ValueError("a chunk address is 32 bytes")
        name = address.hex()
        return self.root / name[:2] / name

    # --- writing -------------------------------------------------------------------------
    def put(self, address: bytes, data: bytes) -> None:
        self.put_many([(address, data)])

    def put_many(self, chunks: Sequence[tuple[bytes, bytes]], *, verify: bool = True) -> list[bytes]:
        """Store chunks atomically; return the addresses now held (new or already there).

        Chunks that do not hash to their address are refused (left out of the result).
        Files are written and fsynced on the store's I/O threads: one fsync waits ~2-10 ms
        for the disk, and concurrent fsyncs share journal commits, so a batch of chunks
        costs about one fsync's wait instead of one per chunk.
        """
        direct = self._direct and sum(len(data) for _, data in chunks) >= DIRECT_BATCH_BYTES
        results = list(self._io.map(lambda c: self._write(c[0], c[1], verify, direct), chunks))
        written = [(a, path, size) for a, path, size in filter(None, results) if path is not None]
        if self.fsync:
            list(self._io.map(_fsync_dir, {path.parent for _, path, _ in written}))
        now = time.time()
        if written:
            with self._db() as db:
                db.executemany(
                    "INSERT OR IGNORE INTO chunks(address, size, pins, stored_at) VALUES (?, ?, 0, ?)",
                    [(a, size, now) for a, _, size in written],
                )
        return [r[0] for r in results if r is not None]

    def _write(
        self, address: bytes, data: bytes, verify: bool, direct: bool = False
    ) -> tuple[bytes, Path | None, int] | None:
        """Write one chunk: temporary file, fsync, rename. None if it does not match its address."""
        if verify and not is_valid_chunk(address, data):
            return None
        final = self.path(address)
        if final.exists():
            return address, None, 0
        tmp = final.with_name(f"{final.name}.{uuid.uuid4().hex}.tmp")
        try:
            if not (direct and len(data) >= DIRECT_MIN_BYTES and self._write_direct(tmp, data)):
                fd = self._create(tmp)
                try:
                    _write_all(fd, memoryview(data))
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return address, final, len(data)

    def _write_direct(self, tmp: Path, data: bytes) -> bool:
        """Write ``data``'s whole pages with O_DIRECT and the rest through the page cache.

        Copying a chunk into the page cache costs the kernel more CPU than anything else a
        replicated upload does (about 2 core-seconds per GB on a virtual machine, where
        fresh page-cache pages are expensive; three copies of each byte are stored). With
        O_DIRECT the disk reads the bytes from a reused, page-aligned buffer instead: one
        copy in user space into it, then DMA. The file is the same; a later read comes from
        the disk rather than the cache. False (nothing written) where O_DIRECT is refused.
        """
        whole = len(data) - len(data) % _PAGE
        buffer = getattr(self._aligned, "buffer", None)
        if buffer is None or len(buffer) < whole:
            buffer = self._aligned.buffer = mmap.mmap(-1, -(-whole // (1 << 20)) * (1 << 20))
        view = memoryview(data)
        try:
            fd = self._create(tmp, _O_DIRECT)
        except OSError:  # EINVAL: the filesystem does not do O_DIRECT
            self._direct = False
            return False
        try:
            with memoryview(buffer)[:whole] as aligned:
                aligned[:] = view[:whole]
                _write_all(fd, aligned)
        except OSError:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            self._direct = False
            return False
        os.close(fd)
        fd = os.open(tmp, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, view[whole:])
            if self.fsync:
                os.fsync(fd)  # the tail, the file's size and its blocks (the pages are on the disk)
        finally:
            os.close(fd)
        return True

    def _create(self, tmp: Path, flags: int = 0) -> int:
        # The 256 fan-out directories are made once per process, not checked per chunk;
        # one removed behind our back (a wiped store) is made again.
        if tmp.parent not in self._dirs:
            tmp.parent.mkdir(exist_ok=True)
            self._dirs.add(tmp.parent)
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o644)
        except FileNotFoundError:
            tmp.parent.mkdir(exist_ok=True)
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o644)

    # --- reading -------------------------------------------------------------------------
    def has(self, address: bytes) -> bool:
        return self.path(address).exists()

    def has_many(self, addresses: Iterable[bytes]) -> list[bytes]:
        return [a for a in addresses if self.has(a)]

    def get(self, address: bytes) -> bytes:
        """The chunk's bytes, verified; a corrupt file is quarantined and reported."""
        path = self.path(address)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ChunkNotFound(address) from None
        if not is_valid_chunk(address, data):
            self._quarantine(address, path)
            raise CorruptChunk(address)
        return data

    def verify_many(self, addresses: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        """Scrub: re-read and re-hash the copies held of ``addresses`` on the I/O threads.

        Returns (good, corrupt); corrupt copies are quarantined, so they read as missing.
        Addresses not held are in neither list.
        """

        def check(address: bytes) -> bool | None:
            try:
                self.get(address)
            except CorruptChunk:
                return False
            except ChunkNotFound:
                return None
            return True

        results = list(self._io.map(check, addresses))
        good = [a for a, ok in zip(addresses, results, strict=True) if ok]
        corrupt = [a for a, ok in zip(addresses, results, strict=True) if ok is False]
        return good, corrupt

    def get_many(self, addresses: Sequence[bytes]) -> Iterator[bytes]:
        for address in addresses:
            yield self.get(address)

    def _quarantine(self, address: bytes, path: Path) -> None:
        try:
            os.replace(path, self.root / "corrupt" / f"{path.name}.{uuid.uuid4().hex[:8]}")
        except FileNotFoundError:
            pass
        with self._db() as db:
            db.execute("DELETE FROM chunks WHERE address = ?", (address,))

    def addresses(self) -> Iterator[bytes]:
        """Every address held, from the files (the truth), not the index."""
        for sub in sorted(self.root.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    if len(f.name) == 2 * ADDRESS_SIZE:
                        yield bytes.fromhex(f.name)

    def indexed(self) -> list[bytes]:
        """Every address the index records (held now, or held before the files were lost)."""
        with self._db() as db:
            return [bytes(row[0]) for row in db.execute("SELECT address FROM chunks ORDER BY address")]

    def missing(self) -> list[bytes]:
        """Indexed addresses whose file is not here (a restored index without its chunks)."""
        return [a for a in self.indexed() if not self.path(a).exists()]

    def backup_index(self, target: Path) -> None:
        """A consistent copy of the index (SQLite's online backup), while the node runs."""
        source = sqlite3.connect(self.root / "index.sqlite3", timeout=INDEX_LOCK_TIMEOUT_S)
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
            source.close()

    def delete(self, address: bytes) -> None:
        self.path(address).unlink(missing_ok=True)
        with self._db() as db:
            db.execute("DELETE FROM chunks WHERE address = ?", (address,))

    # --- pins and gc ---------------------------------------------------------------------
    def pin(self, addresses: Iterable[bytes], delta: int = 1) -> None:
        """Add ``delta`` to each chunk's pin count (one count per pinned blob using it)."""
        now = time.time()
        with self._db() as db:
            for address in addresses:
                size = self.path(address).stat().st_size if delta > 0 else 0
                db.execute(
                    "INSERT INTO chunks(address, size, pins, stored_at) VALUES (?, ?, 0, ?) "
                    "ON CONFLICT(address) DO NOTHING",
                    (address, size, now),
                )
                db.execute("UPDATE chunks SET pins = MAX(0, pins + ?) WHERE address = ?", (delta, address))

    def unpin(self, addresses: Iterable[bytes]) -> None:
        self.pin(addresses, delta=-1)

    def pins(self, address: bytes) -> int:
        with self._db() as db:
            row = db.execute("SELECT pins FROM chunks WHERE address = ?", (address,)).fetchone()
        return row[0] if row else 0

    def gc(self, keep: Callable[[bytes], bool] = lambda _a: False, *, grace_s: float = 0.0) -> GcResult:
        """Delete unpinned chunks older than ``grace_s`` unless ``keep(address)`` says otherwise.

        ``keep`` is how the network layer protects the chunks this node is responsible
        for; the grace period protects chunks of an upload that is not pinned yet.
        """
        cutoff = time.time() - grace_s
        with self._db() as db:
            rows = db.execute(
                "SELECT address, size FROM chunks WHERE pins = 0 AND stored_at <= ?", (cutoff,)
            ).fetchall()
        removed, freed = [], 0
        for address, size in rows:
            if keep(address):
                continue
            self.path(address).unlink(missing_ok=True)
            removed.append(address)
            freed += size
        with self._db() as db:
            db.executemany("DELETE FROM chunks WHERE address = ? AND pins = 0", [(a,) for a in removed])
        return GcResult(len(removed), freed)

    def usage(self) -> StoreUsage:
        with self._db() as db:
            chunks, size, pinned, pinned_size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), COALESCE(SUM(pins > 0), 0), "
                "COALESCE(SUM(CASE WHEN pins > 0 THEN size ELSE 0 END), 0) FROM chunks"
            ).fetchone()
        return StoreUsage(chunks, size, pinned, pinned_size)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]  # os.write may write less than asked
