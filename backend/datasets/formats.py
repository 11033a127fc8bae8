"""Parsing uploaded datasets into one canonical form: x float32, y int64, an ordered class list.

Plain numpy, no Django: the same code checks an upload and a granted dataset.

Class ids: labels map to ids by their position in an ordered class list. The list
is given at upload (``classes``) when providers must agree on ids across nodes
(a node whose partition lacks a class would otherwise number them differently).
Without it, integer labels keep their value as the id (classes "0".."max") and
string labels are numbered in sorted order. The list is recorded with the dataset
and is part of its schema hash.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import zipfile
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from fl_node.data import record_digests

MAX_CLASSES = 10_000
CONTENT_HASH_DOMAIN = b"defl-dataset-records-v1\n"
MAX_CSV_COLUMNS = 100_000
# A padded blob's real record count is written with exactly this many decimal digits, so that the
# blob's header (hence its length) never depends on it.
RECORDS_DIGITS = 12
_RECORDS_PATTERN = re.compile(f"[0-9]{{{RECORDS_DIGITS}}}")


class DatasetFormatError(ValueError):
    """The file cannot be read as the declared format or breaks the schema rules."""


@dataclass(frozen=True)
class CanonicalDataset:
    x: np.ndarray  # float32, shape (n, *feature_shape)
    y: np.ndarray  # int64, shape (n,), values in [0, len(classes))
    classes: tuple[str, ...]

    @property
    def num_samples(self) -> int:
        return int(self.x.shape[0])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])

    @property
    def num_features(self) -> int:
        return int(np.prod(self.feature_shape))

    @property
    def schema(self) -> dict:
        return {
            "feature_shape": list(self.feature_shape),
            "x_dtype": "float32",
            "y_dtype": "int64",
            "classes": list(self.classes),
        }

    @cached_property
    def schema_hash(self) -> str:
        """Equal for datasets that one model can train on together (same features and classes)."""
        canonical = json.dumps(self.schema, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(canonical).hexdigest()

    @cached_property
    def serialized(self) -> bytes:
        """Deterministic bytes (safetensors: no pickle, no timestamps), so the content hash is stable."""
        metadata = {"classes": json.dumps(list(self.classes))}
        return save_safetensors(
            {"x": np.ascontiguousarray(self.x), "y": np.ascontiguousarray(self.y)}, metadata
        )

    @cached_property
    def record_digests(self) -> list[bytes]:
        """SHA-256 of each record's canonical bytes (``fl_node.data.record_digests``)."""
        return record_digests(self.x, self.y)

    @cached_property
    def content_hash(self) -> str:
        """The records' PLAIN order-insensitive hash: SHA-256 over the sorted record digests.

        Local only: published, it would tell anyone who knows all records but one whether that
        one is in. The chain registers a keyed commitment instead (backend.datasets.commitment);
        this value only recognises datasets registered before commitments were keyed."""
        return hashlib.sha256(CONTENT_HASH_DOMAIN + b"".join(sorted(self.record_digests))).hexdigest()

    @cached_property
    def blob_hash(self) -> str:
        """SHA-256 of the serialized blob: the content hash of datasets registered before records
        were hashed one by one (``load_dataset_arrays`` accepts either)."""
        return hashlib.sha256(self.serialized).hexdigest()

    def first(self, count: int) -> CanonicalDataset:
        """The first ``count`` records (all of them when there are no more): what a blob of that
        capacity keeps (``padded``), so that commitments cover exactly the stored records."""
        if count >= self.num_samples:
            return self
        return CanonicalDataset(x=self.x[:count], y=self.y[:count], classes=self.classes)

    def padded(self, capacity: int) -> bytes:
        """Safetensors bytes whose length depends only on ``capacity``, the feature shape and the
        class list, never on the number of records: x and y each hold exactly ``capacity`` rows,
        the real records first, then zero rows (x float32 zeros, y int64 zeros). The metadata
        holds ``classes`` (as ``serialized`` does) and ``records``, the real row count as a
        zero-padded decimal string of ``RECORDS_DIGITS`` digits, so the header's length is fixed
        too. ``deserialize`` returns the real records only.

        ``capacity`` is ``fl_node.dp_count.blob_capacity`` of the dataset's public DP count. A
        dataset with more records than that (its count's noise fell more than six standard
        deviations below zero: probability about 1e-9) keeps its first ``capacity`` records
        only: a larger blob would tell that the dataset is larger than its count says.

        The header is written here rather than by ``safetensors.numpy.save``, which writes the
        metadata keys in a random (hash map) order: these bytes are deterministic, and
        ``safetensors`` (and ``deserialize``) read them as any other safetensors file.
        ``serialized`` stays unpadded: its hash identifies datasets registered before padding.
        """
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"a blob's capacity is a positive integer, got {capacity!r}")
        if capacity >= 10**RECORDS_DIGITS:
            raise ValueError(f"a blob's capacity must be below 10^{RECORDS_DIGITS}, got {capacity}")
        kept = min(self.num_samples, capacity)
        x = np.zeros((capacity, *self.feature_shape), dtype="<f4")
        y = np.zeros((capacity,), dtype="<i8")
        x[:kept] = self.x[:kept]
        y[:kept] = self.y[:kept]
        metadata = {"classes": json.dumps(list(self.classes)), "records": f"{kept:0{RECORDS_DIGITS}d}"}
        return _safetensors_bytes(x, y, metadata)


def _safetensors_bytes(x: np.ndarray, y: np.ndarray, metadata: dict[str, str]) -> bytes:
    """A safetensors file of x (float32) and y (int64), little-endian, with a deterministic
    header: metadata keys in the given order, then y and x (the order ``safetensors`` itself
    writes: larger alignment first), padded with spaces to a multiple of 8 bytes."""
    x_bytes, y_bytes = x.astype("<f4").tobytes(), y.astype("<i8").tobytes()
    header = {
        "__metadata__": metadata,
        "y": {"dtype": "I64", "shape": list(y.shape), "data_offsets": [0, len(y_bytes)]},
        "x": {
            "dtype": "F32",
            "shape": list(x.shape),
            "data_offsets": [len(y_bytes), len(y_bytes) + len(x_bytes)],
        },
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + y_bytes + x_bytes


def deserialize(blob: bytes) -> CanonicalDataset:
    """Inverse of ``CanonicalDataset.serialized`` and of ``CanonicalDataset.padded`` (for a
    dataset fetched from the store): a blob without ``records`` metadata (stored before blobs
    were padded) holds records only; a padded one holds its first ``records`` rows as records
    and padding after them, which is dropped here."""
    try:
        arrays = load_safetensors(blob)
        # The safetensors header is an 8-byte length and JSON; the class list is in its metadata.
        header_length = int.from_bytes(blob[:8], "little")
        metadata = json.loads(blob[8 : 8 + header_length]).get("__metadata__", {})
        classes = tuple(json.loads(metadata["classes"]))
        x, y = arrays["x"], arrays["y"]
    except Exception as exc:  # safetensors raises its own error type and ValueError
        raise DatasetFormatError(f"stored dataset is not a canonical dataset: {exc}") from exc
    if "records" in metadata:
        records = metadata["records"]
        if not isinstance(records, str) or not _RECORDS_PATTERN.fullmatch(records):
            raise DatasetFormatError(
                f"stored dataset's record count must be {RECORDS_DIGITS} decimal digits, got {records!r}"
            )
        count = int(records)
        if count > x.shape[0] or count > y.shape[0]:
            raise DatasetFormatError(
                f"stored dataset claims {count} records but holds {min(x.shape[0], y.shape[0])} rows"
            )
        x, y = x[:count], y[:count]
    return CanonicalDataset(x=x, y=y, classes=classes)


def _map_labels(raw_labels: np.ndarray, classes: list[str] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map labels (ints or strings) to class ids; see the module docstring for the rules."""
    as_text = np.array([str(v).strip() for v in raw_labels])
    if classes:
        if len(set(classes)) != len(classes):
            raise DatasetFormatError("classes contains duplicates")
        index = {name: i for i, name in enumerate(classes)}
        unknown = sorted(set(as_text.tolist()) - index.keys())
        if unknown:
            raise DatasetFormatError(f"labels not in classes: {', '.join(unknown[:5])}")
        return np.array([index[v] for v in as_text], dtype=np.int64), tuple(classes)
    try:
        ints = np.array([int(v) for v in as_text], dtype=np.int64)
    except ValueError:
        names = sorted(set(as_text.tolist()))
        if len(names) > MAX_CLASSES:
            raise DatasetFormatError(f"more than {MAX_CLASSES} distinct labels") from None
        index = {name: i for i, name in enumerate(names)}
        return np.array([index[v] for v in as_text], dtype=np.int64), tuple(names)
    return _check_integer_labels(ints), tuple(str(i) for i in range(int(ints.max()) + 1))


def _check_integer_labels(y: np.ndarray) -> np.ndarray:
    if y.size and y.min() < 0:
        raise DatasetFormatError("integer labels must be >= 0")
    if y.size and y.max() >= MAX_CLASSES:
        raise DatasetFormatError(f"integer labels must be < {MAX_CLASSES}")
    return y


def _finish(x: np.ndarray, y: np.ndarray, classes: tuple[str, ...]) -> CanonicalDataset:
    if x.shape[0] == 0:
        raise DatasetFormatError("the dataset has no samples")
    if not np.isfinite(x).all():
        raise DatasetFormatError("features contain NaN or infinite values")
    if len(classes) < 2:
        raise DatasetFormatError("a classification dataset needs at least two classes")
    return CanonicalDataset(x=x, y=y, classes=classes)


def parse_csv(data: bytes, label_column: str, classes: list[str] | None = None) -> CanonicalDataset:
    """A CSV with a header row: one label column, every other column a numeric feature."""
    if not label_column:
        raise DatasetFormatError("label_column is required for CSV")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetFormatError("the CSV is not UTF-8 text") from exc
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise DatasetFormatError(f"not a valid CSV: {exc}") from exc
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        raise DatasetFormatError("the CSV is empty")
    header = [name.strip() for name in rows[0]]
    if len(header) > MAX_CSV_COLUMNS:
        raise DatasetFormatError(f"more than {MAX_CSV_COLUMNS} columns")
    if label_column not in header:
        raise DatasetFormatError(
            f"label column {label_column!r} is not in the header ({', '.join(header[:10])})"
        )
    if len(header) < 2:
        raise DatasetFormatError("the CSV needs at least one feature column besides the label")
    label_index = header.index(label_column)
    body = rows[1:]
    for line_number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DatasetFormatError(
                f"line {line_number} has {len(row)} fields, the header has {len(header)}"
            )
    if not body:
        raise DatasetFormatError("the dataset has no samples")
    table = np.array(body, dtype=object)
    labels = table[:, label_index]
    features = np.delete(table, label_index, axis=1)
    try:
        x = features.astype(np.float64).astype(np.float32)
    except ValueError as exc:
        raise DatasetFormatError(f"feature columns must be numeric: {exc}") from exc
    y, class_names = _map_labels(labels, classes)
    return _finish(x, y, class_names)


def _check_npz_sizes(data: bytes, max_unpacked_bytes: int | None) -> None:
    """Refuse a compressed bomb or a forged array header before anything is unpacked.

    The archive's directory states what each member unpacks to, and zipfile never returns
    more than that; each .npy header states its array's size, which numpy allocates before
    it reads. Both are checked here: their sum against the node's limit, each header against
    its member's size (a header that claims more than its member holds is forged or cut).
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = {info.filename: info for info in archive.infolist()}
            unpacked = sum(info.file_size for info in members.values())
            if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
                raise DatasetFormatError(
                    f"the .npz would unpack to {unpacked} bytes, more than this node's limit of "
                    f"{max_unpacked_bytes} bytes (DEFL_MAX_DATASET_BYTES)"
                )
            for name in ("x.npy", "y.npy"):
                info = members.get(name)
                if info is None:
                    continue  # reported as a missing array below
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if claimed > info.file_size:
                    raise DatasetFormatError(
                        f"array {name[:-4]} declares shape {tuple(shape)} ({claimed} bytes) but its "
                        f"member holds {info.file_size} bytes: the .npz is cut short or forged"
                    )
    except DatasetFormatError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, NotImplementedError) as exc:
        raise DatasetFormatError(f"not a readable .npz file: {exc}") from exc


def parse_npz(
    data: bytes, classes: list[str] | None = None, max_unpacked_bytes: int | None = None
) -> CanonicalDataset:
    """A NumPy .npz with arrays ``x`` (2-D, or image-shaped) and ``y`` (integer, 1-D, same length)."""
    if not data.startswith(b"PK"):
        # np.load would try to unpickle anything that is not a zip and report that instead.
        raise DatasetFormatError("not a .npz file (a .npz is a zip archive of .npy arrays)")
    _check_npz_sizes(data, max_unpacked_bytes)
    try:
        # allow_pickle=False: an uploaded file must never execute code while loading.
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            missing = {"x", "y"} - set(archive.files)
            if missing:
                raise DatasetFormatError(f"the .npz lacks array(s) {', '.join(sorted(missing))}")
            x, y = archive["x"], archive["y"]
            if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
                # NpzFile returns a member that is not an .npy as raw bytes.
                raise DatasetFormatError("the .npz members x and y must be .npy arrays")
    except DatasetFormatError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise DatasetFormatError(f"not a readable .npz file: {exc}") from exc
    if x.ndim < 2:
        raise DatasetFormatError(f"x must be 2-D or image-shaped, got shape {x.shape}")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise DatasetFormatError(f"x must be numeric, got dtype {x.dtype}")
    if y.ndim != 1:
        raise DatasetFormatError(f"y must be 1-D, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DatasetFormatError(f"y must hold integers, got dtype {y.dtype}")
    if x.shape[0] != y.shape[0]:
        raise DatasetFormatError(f"x has {x.shape[0]} samples and y has {y.shape[0]}")
    y = _check_integer_labels(y.astype(np.int64))
    if classes:
        if y.size and int(y.max()) >= len(classes):
            raise DatasetFormatError(f"label {int(y.max())} has no name in classes ({len(classes)} given)")
        class_names = tuple(classes)
    else:
        class_names = tuple(str(i) for i in range(int(y.max()) + 1 if y.size else 0))
    return _finish(x.astype(np.float32), y, class_names)
