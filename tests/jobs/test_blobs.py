"""The jobs app's blob cache: one fetch of a round's update serves every reader in the process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.jobs import blobs
from backend.swarm.errors import SwarmError

pytestmark = pytest.mark.django_db


@pytest.fixture
def ctx():
    from backend.swarm.factory import node_swarm

    blobs.clear()
    yield SimpleNamespace(swarm=node_swarm())
    blobs.clear()


def _drop_chunks(ctx, reference: str) -> None:
    for address in ctx.swarm.chunk_addresses(reference):
        ctx.swarm.store.unpin([address])
        ctx.swarm.store.delete(address)


def test_a_blob_read_once_is_served_from_memory(ctx):
    data = b"update bytes " * 1000
    reference = blobs.put(ctx, data)
    blobs.clear()
    assert blobs.get(ctx, reference) == data  # from the store, and remembered
    _drop_chunks(ctx, reference)
    assert blobs.get(ctx, "0x" + reference.upper()) == data  # the same reference, however spelled
    blobs.clear()
    with pytest.raises(SwarmError):
        blobs.get(ctx, reference)


def test_prefetch_fills_the_cache_and_swallows_failures(ctx, monkeypatch):
    reference = blobs.put(ctx, b"x" * 5000)
    blobs.clear()
    blobs.prefetch(ctx, reference)
    assert blobs.cached(reference)
    blobs.prefetch(ctx, "ab" * 32)  # nothing there: the action's own read will report it
    assert not blobs.cached("ab" * 32)


def test_the_cache_is_bounded_in_bytes_and_skips_big_blobs(ctx, monkeypatch):
    monkeypatch.setattr(blobs, "CACHE_BYTES", 25_000)
    monkeypatch.setattr(blobs, "CACHE_BLOB_MAX", 15_000)
    first = blobs.put(ctx, b"a" * 10_000)
    second = blobs.put(ctx, b"b" * 10_000)
    big = blobs.put(ctx, b"c" * 20_000)
    assert blobs.cached(first) and blobs.cached(second) and not blobs.cached(big)
    blobs.get(ctx, first)  # used: now the most recent
    third = blobs.put(ctx, b"d" * 10_000)
    assert blobs.cached(first) and blobs.cached(third) and not blobs.cached(second)
