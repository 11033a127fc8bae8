"""Chunking, references, encryption and joining, in memory (pipeline.py, joiner.py, crypto.py)."""

import io
import os

import pytest

from backend.swarm.chunker import FixedSizeSplitter
from backend.swarm.errors import InvalidReference
from backend.swarm.joiner import blob_span, child_spans, join, walk
from backend.swarm.pipeline import store_stream
from backend.swarm.reference import Reference, chunk_address, is_valid_chunk
from tests.swarm.helpers import ListSink

SIZE = 4096  # small chunks give deep trees from small blobs


def put(data: bytes, *, encrypt: bool = False, chunk_size: int = SIZE) -> tuple[Reference, ListSink]:
    sink = ListSink()
    return store_stream(io.BytesIO(data), sink, encrypt=encrypt, chunk_size=chunk_size), sink


def read(ref: Reference, sink: ListSink) -> bytes:
    return b"".join(bytes(p) for p in join(ref, sink, max_bytes=1 << 40, chunk_size=SIZE))


LENGTHS = [0, 1, SIZE - 1, SIZE, SIZE + 1, SIZE * 128, SIZE * 128 + 1, SIZE * 129, SIZE * 128 * 2 + 7]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("encrypt", [False, True])
def test_round_trip_and_walk_finds_every_chunk(length, encrypt):
    data = os.urandom(length)
    ref, sink = put(data, encrypt=encrypt)
    assert read(ref, sink) == data
    assert blob_span(ref, sink) == length
    assert set(walk(ref, sink, SIZE)) == set(sink.chunks)


def test_deep_tree_with_carried_entries():
    # 64 entries per encrypted intermediate: 64*64+3 leaves need three levels and a carry-up.
    data = os.urandom(SIZE * (64 * 64 + 3) + 5)
    ref, sink = put(data, encrypt=True)
    assert read(ref, sink) == data
    assert set(walk(ref, sink, SIZE)) == set(sink.chunks)


def test_same_content_same_reference_and_different_content_differs():
    data = os.urandom(SIZE * 5 + 3)
    assert put(data)[0] == put(data)[0]
    assert put(data)[0] != put(data[:-1] + bytes([data[-1] ^ 1]))[0]
    assert len(str(put(data)[0])) == 64


def test_encrypted_reference_carries_a_key_and_chunks_hide_the_plaintext():
    marker = b"PLAINTEXT-MARKER-" * 16
    data = marker * (3 * SIZE // len(marker))
    ref, sink = put(data, encrypt=True)
    assert ref.encrypted and len(str(ref)) == 128
    assert all(marker[:32] not in chunk for chunk in sink.chunks.values())
    plain_ref, plain_sink = put(data)
    assert any(marker[:32] in chunk for chunk in plain_sink.chunks.values())
    # The address is the hash of what is stored (ciphertext): any node can verify it.
    assert all(chunk_address(c) == a for a, c in sink.chunks.items())
    assert Reference.parse(str(ref)) == ref


def test_verification_rejects_a_flipped_bit():
    ref, sink = put(os.urandom(SIZE))
    data = bytearray(sink.chunks[ref.address])
    assert is_valid_chunk(ref.address, bytes(data))
    data[100] ^= 0x01
    assert not is_valid_chunk(ref.address, bytes(data))


def test_splitter_handles_short_reads():
    class Trickle(io.RawIOBase):
        def __init__(self, data):
            self.data = data

        def readable(self):
            return True

        def read(self, n=-1):
            k = min(7, n)
            piece, self.data = self.data[:k], self.data[k:]
            return piece

    class TrickleInto(io.RawIOBase):
        def __init__(self, data):
            self.data = data

        def readable(self):
            return True

        def readinto(self, buffer):
            k = min(7, len(buffer), len(self.data))
            buffer[:k], self.data = self.data[:k], self.data[k:]
            return k

    data = os.urandom(1000)
    for stream in (Trickle(data), TrickleInto(data)):
        pieces = list(FixedSizeSplitter(100).split(stream))
        assert [len(p) for p in pieces] == [100] * 10 and b"".join(pieces) == data
    assert list(FixedSizeSplitter(100).split(io.BytesIO(b""))) == [b""]
    # headroom: free bytes before each piece, for the caller's frame header
    framed = list(FixedSizeSplitter(400).split(io.BytesIO(data), headroom=8))
    assert [len(p) for p in framed] == [408, 408, 208]
    assert b"".join(p[8:] for p in framed) == data


def test_child_spans():
    assert child_spans(3 * SIZE + 1, 4, SIZE, 128) == [SIZE, SIZE, SIZE, 1]
    assert child_spans(128 * SIZE + 1, 2, SIZE, 128) == [128 * SIZE, 1]


@pytest.mark.parametrize("text", ["", "00", "zz" * 32, "ab" * 33])
def test_bad_references_are_refused(text):
    with pytest.raises(InvalidReference):
        Reference.parse(text)


def test_chunk_address_is_the_blake3_of_the_stored_bytes():
    # The published BLAKE3 test vector of the empty input: addresses are plain BLAKE3-256.
    empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert chunk_address(b"").hex() == empty
    data = bytearray(os.urandom(1000))
    assert chunk_address(data) == chunk_address(bytes(data)) == chunk_address(memoryview(data))
