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
