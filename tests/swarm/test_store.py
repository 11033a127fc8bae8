"""The local chunk store: atomic writes, verification on read, pins, reference counts, gc."""

import os
import shutil
import threading

import pytest

from backend.swarm.errors import ChunkNotFound, CorruptChunk
from backend.swarm.reference import chunk_address
from backend.swarm.store import ChunkStore


def chunk(n: int = 1000) -> tuple[bytes, bytes]:
    data = os.urandom(n)
    return chunk_address(data), data


def test_put_get_usage(tmp_path):
    store = ChunkStore(tmp_path)
    a, b = chunk(), chunk(2000)
    assert set(store.put_many([a, b])) == {a[0], b[0]}
    assert store.get(a[0]) == a[1]
    assert store.put_many([a]) == [a[0]]  # already held: acknowledged, not rewritten
    usage = store.usage()
    assert (usage.chunks, usage.bytes) == (2, 3000)
    with pytest.raises(ChunkNotFound):
        store.get(chunk()[0])


def _open_and_put_together(root, openers: int) -> tuple[list[ChunkStore], list[Exception]]:
    barrier, stores, errors = threading.Barrier(openers), [], []

    def open_and_put() -> None:
        barrier.wait()
        try:
            store = ChunkStore(root, fsync=False)
            store.put_many([chunk()])
            stores.append(store)
        except Exception as exc:  # noqa: BLE001 (reported by the caller's assertion)
            errors.append(exc)

    threads = [threading.Thread(target=open_and_put) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return stores, errors


def test_stores_opened_together_on_a_fresh_directory_all_start_and_share_the_index(tmp_path):
    # The first switch to WAL is refused at once ("database is locked") to all but one of the
    # connections making it together; without the store's wait some of 20 trials of 4 fail.
    for trial in range(20):
        stores, errors = _open_and_put_together(tmp_path / str(trial), openers=4)
        assert not errors, errors
        assert stores[0].usage().chunks == 4


def test_chunks_that_do_not_match_their_address_are_refused(tmp_path):
    store = ChunkStore(tmp_path)
    address, data = chunk()
    assert store.put_many([(address, data + b"x")]) == []
    assert not store.has(address)


def test_write_is_atomic_no_partial_file_on_failure(tmp_path, monkeypatch):
    store = ChunkStore(tmp_path)
    address, data = chunk()
    real_replace = os.replace

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.put(address, data)
    monkeypatch.setattr(os, "replace", real_replace)
    assert not store.has(address)
    assert not list(tmp_path.rglob("*.tmp"))  # the temporary file was cleaned up
    store.put(address, data)
    assert store.get(address) == data


def test_corrupt_file_is_detected_and_quarantined(tmp_path):
    store = ChunkStore(tmp_path)
    address, data = chunk()
    store.put(address, data)
    path = store.path(address)
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0x80
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunk):
        store.get(address)
    assert not store.has(address)
    assert len(list((tmp_path / "corrupt").iterdir())) == 1
    store.put(address, data)  # a good copy can come back
    assert store.get(address) == data


def test_pins_count_references_and_gc_keeps_pinned_and_kept(tmp_path):
    store = ChunkStore(tmp_path)
    shared, only_a, loose, kept = chunk(), chunk(), chunk(), chunk()
    store.put_many([shared, only_a, loose, kept])
    store.pin([shared[0], only_a[0]])  # blob A
    store.pin([shared[0]])  # blob B shares a chunk
    assert store.pins(shared[0]) == 2
    assert store.usage().pinned_chunks == 2

    result = store.gc(keep=lambda a: a == kept[0])
    assert (result.removed_chunks, result.removed_bytes) == (1, 1000)
    assert not store.has(loose[0]) and store.has(kept[0]) and store.has(shared[0])

    store.unpin([shared[0], only_a[0]])  # unpin blob A: the shared chunk is still pinned by B
    store.gc()
    assert store.has(shared[0]) and not store.has(only_a[0])
    store.unpin([shared[0]])
    store.unpin([shared[0]])  # never below zero
    assert store.pins(shared[0]) == 0
    store.gc()
    assert not store.has(shared[0])


def test_gc_grace_period_protects_fresh_chunks(tmp_path):
    store = ChunkStore(tmp_path)
    address, data = chunk()
    store.put(address, data)
    assert store.gc(grace_s=3600).removed_chunks == 0
    assert store.has(address)


def test_a_fan_out_directory_removed_behind_the_store_is_made_again(tmp_path):
    store = ChunkStore(tmp_path / "s", fsync=False)
    address, data = chunk()
    store.put(address, data)
    shutil.rmtree(store.path(address).parent)  # the store made it, and remembers that
    store.put(address, data)
    assert store.get(address) == data


def test_full_size_chunks_are_written_past_the_page_cache_or_buffered_where_refused(tmp_path, monkeypatch):
    import backend.swarm.store as store_module

    chunks = [os.urandom((1 << 20) + 8) for _ in range(4)] + [os.urandom(1 << 20), os.urandom(5000)]
    direct = ChunkStore(tmp_path / "direct", fsync=True)
    written = []
    real_write_direct = direct._write_direct
    monkeypatch.setattr(
        direct, "_write_direct", lambda tmp, data: written.append(len(data)) or real_write_direct(tmp, data)
    )
    direct.put_many([(chunk_address(c), c) for c in chunks])  # a bulk batch: past the page cache
    assert sorted(written) == [1 << 20] + [(1 << 20) + 8] * 4
    assert all(direct.get(chunk_address(c)) == c for c in chunks)
    small = os.urandom((1 << 20) + 8)
    direct.put_many([(chunk_address(small), small)])  # a small blob's chunk stays in the page cache
    assert len(written) == 5 and direct.get(chunk_address(small)) == small

    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & store_module._O_DIRECT:
            raise OSError(22, "Invalid argument")  # tmpfs and some network filesystems
        return real_open(path, flags, *args)

    monkeypatch.setattr(store_module.os, "open", no_direct)
    buffered = ChunkStore(tmp_path / "buffered", fsync=True)
    buffered.put_many([(chunk_address(c), c) for c in chunks])
    assert not buffered._direct
    assert all(buffered.get(chunk_address(c)) == c for c in chunks)
    assert not list((tmp_path / "buffered").glob("??/*.tmp"))
