"""The joiner's tree rules: hand-made trees that break them are refused where they break.

In memory (ListSink): each tree is built chunk by chunk, the way a hostile author would.
"""

from __future__ import annotations

import io
import os

import pytest

from backend.swarm.errors import BlobTooLarge, InvalidTree
from backend.swarm.joiner import join, open_blob, walk
from backend.swarm.pipeline import store_stream
from backend.swarm.reference import Reference, chunk_address, encode_span
from tests.swarm.helpers import ListSink

SIZE = 4096
BRANCHES = SIZE // 32


class CountingSink(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.fetched = 0

    def get_many(self, addresses):
        for address in addresses:
            self.fetched += 1
            yield self.chunks[address]


def add(sink: ListSink, span: int, payload: bytes) -> bytes:
    data = encode_span(span) + payload
    address = chunk_address(data)
    sink.put(address, data)
    return address


def read(ref: Reference, sink: ListSink, max_bytes: int = 1 << 40) -> bytes:
    return b"".join(bytes(p) for p in join(ref, sink, max_bytes=max_bytes, chunk_size=SIZE))


def test_a_root_larger_than_the_limit_is_refused_after_one_fetch():
    sink = CountingSink()
    leaf = add(sink, SIZE, b"A" * SIZE)
    inner = add(sink, BRANCHES * SIZE, leaf * BRANCHES)
    root = add(sink, BRANCHES * BRANCHES * SIZE, inner * BRANCHES)  # a canonical 64 MiB tree of one leaf
    with pytest.raises(BlobTooLarge) as error:
        open_blob(Reference(root), sink, max_bytes=1 << 20, chunk_size=SIZE)
    assert error.value.size == BRANCHES * BRANCHES * SIZE and sink.fetched == 1
    with pytest.raises(BlobTooLarge):
        list(walk(Reference(root), sink, SIZE, max_bytes=1 << 20))


def test_a_canonical_tree_of_repeated_leaves_reads_exactly_its_span():
    # Repeated leaves are legitimate (a blob of zeros): the bytes read are the root's span.
    data = bytes(SIZE * 5 + 17)
    sink = ListSink()
    ref = store_stream(io.BytesIO(data), sink, chunk_size=SIZE)
    assert read(ref, sink, max_bytes=len(data)) == data
    with pytest.raises(BlobTooLarge):
        read(ref, sink, max_bytes=len(data) - 1)


def test_a_root_that_understates_its_span_is_refused():
    sink = ListSink()
    leaf = add(sink, SIZE, b"A" * SIZE)
    liar = add(sink, 100, leaf * BRANCHES)  # claims 100 bytes, lists 128 leaves
    with pytest.raises(InvalidTree, match="payload is not its span"):
        read(Reference(liar), sink, max_bytes=1000)


def test_more_children_than_the_span_needs_are_refused_before_they_are_fetched():
    sink = CountingSink()
    leaf = add(sink, SIZE, b"A" * SIZE)
    wide = add(sink, 3 * SIZE, leaf * BRANCHES)  # 3 leaves' span, 128 children
    with pytest.raises(InvalidTree, match="too many"):
        read(Reference(wide), sink)
    assert sink.fetched == 1


def test_a_child_whose_span_differs_from_its_parents_is_refused():
    sink = ListSink()
    short = add(sink, 10, b"0123456789")
    full = add(sink, SIZE, b"B" * SIZE)
    # A parent of span 2*SIZE expects a full first child: it gets a 10-byte one.
    parent = add(sink, 2 * SIZE, short + full)
    with pytest.raises(InvalidTree, match="parent says"):
        read(Reference(parent), sink)


def test_one_child_and_too_many_children_are_refused():
    sink = ListSink()
    leaf = add(sink, SIZE, b"C" * SIZE)
    single = add(sink, SIZE + 1, leaf)  # an intermediate chunk needs two children at least
    with pytest.raises(InvalidTree):
        read(Reference(single), sink)
    too_wide = add(sink, (BRANCHES + 1) * SIZE, leaf * (BRANCHES + 1))
    with pytest.raises(InvalidTree):
        read(Reference(too_wide), sink)


def test_an_oversized_chunk_is_refused():
    sink = ListSink()
    big = add(sink, 2 * SIZE, os.urandom(2 * SIZE))
    with pytest.raises(InvalidTree, match="larger than the chunk size"):
        read(Reference(big), sink)


def test_a_partial_reference_is_refused():
    sink = ListSink()
    leaf = add(sink, SIZE, b"D" * SIZE)
    odd = add(sink, 2 * SIZE, leaf + leaf[:5])
    with pytest.raises(InvalidTree, match="partial"):
        read(Reference(odd), sink)


@pytest.mark.parametrize("encrypt", [False, True])
def test_honest_trees_of_every_shape_pass_the_rules(encrypt):
    for length in (0, 1, SIZE, SIZE + 1, SIZE * BRANCHES, SIZE * BRANCHES + 1, SIZE * (BRANCHES * 3 + 2) + 9):
        data = os.urandom(length)
        sink = ListSink()
        ref = store_stream(io.BytesIO(data), sink, encrypt=encrypt, chunk_size=SIZE)
        assert read(ref, sink, max_bytes=length) == data
        assert set(walk(ref, sink, SIZE, max_bytes=length)) == set(sink.chunks)
