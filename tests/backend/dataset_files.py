"""Small dataset files for the upload tests."""

from __future__ import annotations

import io

import numpy as np
from django.core.files.uploadedfile import SimpleUploadedFile


def csv_file(text: str, name: str = "data.csv") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="text/csv")


def npz_file(name: str = "data.npz", **arrays) -> SimpleUploadedFile:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return SimpleUploadedFile(name, buffer.getvalue(), content_type="application/octet-stream")


GOOD_CSV = "f1,f2,species\n1.0,2.0,cat\n3.5,4.0,dog\n5.0,6.25,cat\n0.5,0.5,bird\n"


def good_npz(samples: int = 12, seed: int = 0) -> SimpleUploadedFile:
    rng = np.random.default_rng(seed)
    return npz_file(x=rng.random((samples, 1, 4, 4)), y=rng.integers(0, 3, samples).astype(np.int64))


# The class names an upload declares (required: inferred from the labels present, the published
# schema would depend on the records): those of good_npz's labels and of GOOD_CSV's.
DEFAULT_CLASSES = {"npz": "0,1,2", "csv": "bird,cat,dog"}


def form(file, fmt: str, **extra) -> dict:
    return {
        "file": file,
        "name": extra.pop("name", "test set"),
        "format": fmt,
        "classes": DEFAULT_CLASSES.get(fmt, ""),
        "epsilon_cap": 8.0,
        "delta": 1e-5,
    } | extra
