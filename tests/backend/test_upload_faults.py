"""Hostile dataset uploads: truncated, the wrong type, compressed bombs, lying array headers.

Each is a 400 whose detail is a sentence, and leaves nothing behind: no Dataset row, no chunk
in the store, no file in the upload temp dir (the common cases of a bad schema and an
oversized body are in test_datasets_upload.py).
"""

from __future__ import annotations

import io
import os
import struct
import zipfile

import numpy as np
import pytest
from dataset_files import GOOD_CSV, csv_file, form, good_npz, npz_file
from django.core.files.uploadedfile import SimpleUploadedFile

from backend.datasets.models import Dataset

pytestmark = pytest.mark.django_db


def _raw(content: bytes, name: str) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="application/octet-stream")


def _npy_header(shape: tuple[int, ...], dtype: str = "<f8") -> bytes:
    """An .npy version 1.0 header that declares ``shape`` (what follows may be anything)."""
    text = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape!r}, }}"
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def _zip(members: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _zero_bomb(unpacked: int) -> bytes:
    """An honest .npz whose x is ``unpacked`` bytes of zeros: deflate packs it about 1000:1."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(_npy_header((unpacked // 8, 1)))
            block = bytes(1 << 20)
            for _ in range(unpacked // len(block)):
                member.write(block)
        y = io.BytesIO()
        np.save(y, np.zeros(unpacked // 8, dtype=np.int64)[:1])
        archive.writestr("y.npy", y.getvalue())
    return buffer.getvalue()


def _good_npz_bytes() -> bytes:
    return good_npz(samples=64).read()


def _stored_chunks() -> int:
    from backend.swarm.factory import local_store

    return local_store().usage().chunks


def _assert_refused_and_nothing_left(response, settings, *words: str) -> None:
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert isinstance(detail, str) and len(detail.split()) >= 3, detail  # a sentence, not a code
    for word in words:
        assert word in detail, detail
    assert Dataset.objects.count() == 0
    assert _stored_chunks() == 0
    assert not list(os.scandir(settings.FILE_UPLOAD_TEMP_DIR))


TRUNCATED_AND_WRONG_TYPE = [
    pytest.param("npz", lambda: _raw(_good_npz_bytes()[:-100], "cut.npz"), {}, ("npz",), id="npz-cut-at-end"),
    pytest.param("npz", lambda: _raw(_good_npz_bytes()[:300], "cut.npz"), {}, ("npz",), id="npz-cut-early"),
    pytest.param("npz", lambda: _raw(b"PK\x03\x04", "stub.npz"), {}, ("npz",), id="npz-only-a-magic"),
    pytest.param("npz", lambda: _raw(b"", "empty.npz"), {}, ("empty",), id="npz-empty"),
    pytest.param(
        "csv", lambda: csv_file(GOOD_CSV[:-9]), {"label_column": "species"}, ("fields",), id="csv-cut-mid-row"
    ),
    pytest.param("csv", lambda: csv_file(""), {"label_column": "species"}, (), id="csv-empty"),
    pytest.param(
        "csv",
        lambda: _raw(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "picture.csv"),
        {"label_column": "species"},
        (),
        id="csv-is-a-png",
    ),
    pytest.param(
        "csv",
        lambda: _raw(_good_npz_bytes(), "archive.csv"),
        {"label_column": "species"},
        (),
        id="csv-is-a-zip",
    ),
    pytest.param("npz", lambda: csv_file(GOOD_CSV, name="t.npz"), {}, ("npz",), id="npz-is-csv"),
    pytest.param(
        "npz",
        lambda: _raw(_zip({"x.npy": b"not an array", "y.npy": b"nor this"}), "junk.npz"),
        {},
        ("npz",),
        id="npz-members-not-npy",
    ),
    pytest.param(
        "npz",
        lambda: npz_file(x=np.array([object(), object()], dtype=object), y=np.array([0, 1])),
        {},
        (),
        id="npz-pickled-objects",
    ),
]


@pytest.mark.parametrize(("fmt", "make_file", "extra", "words"), TRUNCATED_AND_WRONG_TYPE)
def test_truncated_or_wrong_type_upload_is_a_400_that_leaves_nothing(
    provider, settings, fmt, make_file, extra, words
):
    response = provider.post("/api/datasets", form(make_file(), fmt, **extra))
    _assert_refused_and_nothing_left(response, settings, *words)


def test_an_array_header_that_claims_terabytes_is_a_400(provider, settings):
    """x.npy declares 10^12 float64s and holds 16 bytes: refused before any allocation."""
    y = io.BytesIO()
    np.save(y, np.array([0, 1]))
    archive = _zip({"x.npy": _npy_header((10**12, 1)) + bytes(16), "y.npy": y.getvalue()})
    response = provider.post("/api/datasets", form(_raw(archive, "liar.npz"), "npz"))
    _assert_refused_and_nothing_left(response, settings)


def test_a_zip_member_that_lies_about_its_size_is_a_400(provider, settings):
    """The central directory says 10 bytes; the deflate stream holds 8 MB of zeros."""
    y = io.BytesIO()
    np.save(y, np.array([0, 1]))
    honest = _zip({"x.npy": _npy_header((2, 1)) + bytes(8 << 20), "y.npy": y.getvalue()})
    # Patch x.npy's uncompressed size in both its local header and the central directory.
    size = len(_npy_header((2, 1))) + (8 << 20)
    lying = honest.replace(struct.pack("<I", size), struct.pack("<I", 10))
    assert lying != honest
    response = provider.post("/api/datasets", form(_raw(lying, "liar.npz"), "npz"))
    _assert_refused_and_nothing_left(response, settings)


def test_a_compressed_bomb_is_refused_by_its_unpacked_size(provider, settings):
    """64 MiB of zeros packed into about 64 KiB: the limit counts what it unpacks to."""
    settings.DEFL_MAX_DATASET_BYTES = 16 << 20
    bomb = _zero_bomb(64 << 20)
    assert len(bomb) < settings.DEFL_MAX_UPLOAD_BYTES and len(bomb) < 1 << 20
    response = provider.post("/api/datasets", form(_raw(bomb, "bomb.npz"), "npz"))
    _assert_refused_and_nothing_left(response, settings, "unpack")


def test_an_honest_npz_under_the_unpacked_limit_is_accepted(provider, settings):
    settings.DEFL_MAX_DATASET_BYTES = 16 << 20
    response = provider.post("/api/datasets", form(good_npz(samples=64), "npz"))
    assert response.status_code == 201, response.content
    assert Dataset.objects.count() == 1
