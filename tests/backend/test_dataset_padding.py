"""A dataset's stored blob padded to a capacity: its size depends on the public count alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load as load_safetensors

from backend.datasets.formats import RECORDS_DIGITS, CanonicalDataset, DatasetFormatError, deserialize
from fl_node.dp_count import blob_capacity

CLASSES = ("cat", "dog", "émeu")


def make_dataset(records: int, feature_shape: tuple[int, ...] = (4,), seed: int = 0) -> CanonicalDataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(records, *feature_shape)).astype(np.float32)
    y = rng.integers(0, len(CLASSES), size=records).astype(np.int64)
    return CanonicalDataset(x=x, y=y, classes=CLASSES)


def header_of(blob: bytes) -> tuple[int, dict]:
    length = int.from_bytes(blob[:8], "little")
    return length, json.loads(blob[8 : 8 + length])


def with_records(blob: bytes, records: str) -> bytes:
    """``blob`` with its metadata's record count replaced by ``records`` (the header re-padded)."""
    length, header = header_of(blob)
    header["__metadata__"]["records"] = records
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + length :]


@pytest.mark.parametrize("feature_shape", [(4,), (1, 3, 3)])
def test_round_trip(feature_shape):
    dataset = make_dataset(100, feature_shape)
    blob = dataset.padded(blob_capacity(100))
    back = deserialize(blob)
    assert back.classes == CLASSES
    assert back.num_samples == 100
    assert back.x.dtype == np.float32 and back.y.dtype == np.int64
    np.testing.assert_array_equal(back.x, dataset.x)
    np.testing.assert_array_equal(back.y, dataset.y)
    assert back.content_hash == dataset.content_hash
    assert back.schema_hash == dataset.schema_hash


def test_padding_rows_are_zero_and_records_fixed_width():
    dataset = make_dataset(7)
    arrays = load_safetensors(dataset.padded(10))  # the safetensors library reads it as any other
    assert arrays["x"].shape == (10, 4) and arrays["y"].shape == (10,)
    assert arrays["x"].dtype == np.float32 and arrays["y"].dtype == np.int64
    np.testing.assert_array_equal(arrays["x"][:7], dataset.x)
    assert not arrays["x"][7:].any() and not arrays["y"][7:].any()
    _, header = header_of(dataset.padded(10))
    assert header["__metadata__"] == {"classes": json.dumps(list(CLASSES)), "records": "000000000007"}
    assert len(header["__metadata__"]["records"]) == RECORDS_DIGITS


def test_size_depends_on_capacity_only():
    capacity = blob_capacity(120)
    blobs = [make_dataset(n, seed=n).padded(capacity) for n in (1, 100, 137, capacity)]
    assert len({len(blob) for blob in blobs}) == 1
    assert len({header_of(blob)[0] for blob in blobs}) == 1  # the header's length too
    assert [deserialize(blob).num_samples for blob in blobs] == [1, 100, 137, capacity]
    # Equal to the bytes a capacity of real records would take (the header then the arrays).
    assert len(blobs[0]) == 8 + header_of(blobs[0])[0] + capacity * (4 * 4 + 8)


def test_padded_bytes_are_deterministic():
    dataset = make_dataset(50)
    assert dataset.padded(80) == make_dataset(50).padded(80)


def test_over_capacity_keeps_the_first_records():
    dataset = make_dataset(137)
    blob = dataset.padded(100)
    assert len(blob) == len(make_dataset(100, seed=1).padded(100))
    back = deserialize(blob)
    assert back.num_samples == 100
    np.testing.assert_array_equal(back.x, dataset.x[:100])
    np.testing.assert_array_equal(back.y, dataset.y[:100])


@pytest.mark.parametrize("capacity", [0, -1, True, 2.0, 10**RECORDS_DIGITS])
def test_bad_capacity_is_refused(capacity):
    with pytest.raises(ValueError):
        make_dataset(3).padded(capacity)


def test_unpadded_blob_still_deserializes():
    dataset = make_dataset(37)
    blob = dataset.serialized
    assert "records" not in header_of(blob)[1].get("__metadata__", {})
    back = deserialize(blob)
    assert back.num_samples == 37
    np.testing.assert_array_equal(back.x, dataset.x)
    np.testing.assert_array_equal(back.y, dataset.y)
    assert back.blob_hash == dataset.blob_hash  # legacy identity unchanged


def test_serialized_and_blob_hash_are_unpadded():
    dataset = make_dataset(10)
    assert dataset.serialized != dataset.padded(10)
    assert deserialize(dataset.serialized).serialized == dataset.serialized


def test_untouched_records_field_is_accepted():
    blob = make_dataset(5).padded(9)
    assert deserialize(with_records(blob, "000000000005")).num_samples == 5
    assert deserialize(with_records(blob, "000000000009")).num_samples == 9  # all rows


@pytest.mark.parametrize(
    "records",
    [
        "000000000010",  # more than the 9 rows present
        "999999999999",
        "5",  # not fixed width
        "00000000005",
        "0000000000005",
        "-00000000005",
        "00000000000x",
        " 00000000005",
        "٠٠٠٠٠٠٠٠٠٠٠٥",  # Unicode digits are not decimal ASCII digits
    ],
)
def test_tampered_records_field_is_refused(records):
    blob = make_dataset(5).padded(9)
    with pytest.raises(DatasetFormatError):
        deserialize(with_records(blob, records))
