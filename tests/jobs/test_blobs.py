"""The jobs app's blob cache: one fetch of a round's update serves every reader of the node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.jobs import blobs
from backend.jobs.driver.memory import DriverMemory
from backend.swarm.errors import SwarmError

pytestmark = pytest.mark.django_db


@pytest.fixture
def ctx():
    from backend.swarm.factory import node_swarm

    return SimpleNamespace(swarm=node_swarm(), memory=DriverMemory())


def _drop_chunks(ctx, reference: str) -> None:
    for address in ctx.swarm.chunk_addresses(reference):
        ctx.swarm.store.unpin([address])
        ctx.swarm.store.delete(address)


def test_a_blob_read_once_is_served_from_memory(ctx):
    data = b"update bytes " * 1000
    reference = blobs.put(ctx, data)
    ctx.memory.clear()  # a restart
    assert blobs.get(ctx, reference) == data  # from the store, and remembered
    _drop_chunks(ctx, reference)
    assert blobs.get(ctx, "0x" + reference.upper()) == data  # the same reference, however spelled
    other = SimpleNamespace(swarm=ctx.swarm, memory=DriverMemory())
    with pytest.raises(SwarmError):  # another node's cache is its own
        blobs.get(other, reference)
    ctx.memory.clear()
    with pytest.raises(SwarmError):
        blobs.get(ctx, reference)


def test_prefetch_fills_the_cache_and_swallows_failures(ctx, monkeypatch):
    reference = blobs.put(ctx, b"x" * 5000)
    ctx.memory.blobs.clear()
    blobs.prefetch(ctx, reference)
    assert blobs.cached(ctx, reference)
    blobs.prefetch(ctx, "ab" * 32)  # nothing there: the action's own read will report it
    assert not blobs.cached(ctx, "ab" * 32)


def test_the_cache_is_bounded_in_bytes_and_skips_big_blobs(ctx, monkeypatch):
    monkeypatch.setattr(blobs, "CACHE_BYTES", 25_000)
    monkeypatch.setattr(blobs, "CACHE_BLOB_MAX", 15_000)
    first = blobs.put(ctx, b"a" * 10_000)
    second = blobs.put(ctx, b"b" * 10_000)
    big = blobs.put(ctx, b"c" * 20_000)
    assert blobs.cached(ctx, first) and blobs.cached(ctx, second) and not blobs.cached(ctx, big)
    blobs.get(ctx, first)  # used: now the most recent
    third = blobs.put(ctx, b"d" * 10_000)
    assert blobs.cached(ctx, first) and blobs.cached(ctx, third) and not blobs.cached(ctx, second)


class _SlowSwarm:
    """The node's swarm, its reads counted and held until ``release`` is set."""

    def __init__(self, swarm, *, fail_first: bool = False) -> None:
        import threading

        self.swarm, self.fail_first = swarm, fail_first
        self.reads: list[int] = []
        self.started, self.release = threading.Event(), threading.Event()

    def read_buffer(self, key, *, max_bytes, allocate):
        self.reads.append(max_bytes)
        self.started.set()
        assert self.release.wait(10)
        if self.fail_first and len(self.reads) == 1:
            raise SwarmError("a peer went away mid-read")
        return self.swarm.read_buffer(key, max_bytes=max_bytes, allocate=allocate)


@pytest.mark.parametrize("fail_first", [False, True])
def test_a_blob_being_read_is_waited_for_not_read_twice(ctx, fail_first):
    """The prefetch thread starts reading an update the moment its event is indexed; the score
    action that wants it next waits for that read instead of fetching the blob a second time. A
    read that fails leaves the waiter to read it itself."""
    from concurrent.futures import ThreadPoolExecutor

    data = b"sealed update " * 2000
    reference = blobs.put(ctx, data)
    ctx.memory.clear()
    slow = _SlowSwarm(ctx.swarm, fail_first=fail_first)
    reader = SimpleNamespace(swarm=slow, memory=ctx.memory)
    with ThreadPoolExecutor(2) as pool:
        ahead = pool.submit(blobs.prefetch, reader, reference)
        assert slow.started.wait(10)
        wanted = pool.submit(blobs.get, reader, reference, max_bytes=len(data))
        assert not wanted.done()  # waiting for the read in flight
        slow.release.set()
        assert wanted.result(10) == data
        ahead.result(10)
    assert slow.reads == ([blobs.CACHE_BLOB_MAX, len(data)] if fail_first else [blobs.CACHE_BLOB_MAX])
    assert not ctx.memory.blobs.reading  # nothing left in flight
    assert blobs.cached(ctx, reference)


def test_prefetch_leaves_a_blob_the_cache_would_not_keep_to_its_reader(ctx, monkeypatch):
    monkeypatch.setattr(blobs, "CACHE_BLOB_MAX", 15_000)
    reference = blobs.put(ctx, b"c" * 20_000)
    ctx.memory.clear()
    slow = _SlowSwarm(ctx.swarm)
    slow.release.set()
    reader = SimpleNamespace(swarm=slow, memory=ctx.memory)
    blobs.prefetch(reader, reference)  # refused from its root chunk: larger than any cached blob
    assert slow.reads == [15_000] and not blobs.cached(ctx, reference)
    assert blobs.get(reader, reference) == b"c" * 20_000  # the reader, with its own bound
