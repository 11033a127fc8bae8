"""Update and model serialization: deterministic safetensors bytes, dense or sparse-delta tensors.

An *update* is the change a trainer proposes to the global model: a mapping from
parameter name to a float32 delta. Every node must derive the same content hash
from the same update (the chain stores the hash as ``bytes32`` and aggregation
sorts by it), so encoding is canonical:

* The container is safetensors (Hugging Face): tensors ordered by alignment,
  then name. The library serializes its ``__metadata__`` map from a Rust
  ``HashMap``, in an order that changes from process to process, so we store
  exactly one metadata key, ``"defl"``, holding our own JSON written with
  sorted keys and no whitespace. We write the container ourselves, byte for
  byte as ``safetensors.torch.save`` would (tests check equality and that the
  library loads it), because the library copies the data twice and on these
  machines fresh memory is the bottleneck.
* Each tensor is written either dense or as *sparse rows*: the indices of the
  rows (along dimension 0) that hold any non-zero value, plus those rows. The
  choice depends on content only: sparse is used exactly when it is smaller,
  i.e. when the fraction of touched rows is below
  ``row_bytes / (row_bytes + 8)`` (8 bytes per int64 index). An embedding
  update touching 2% of its rows therefore costs about 2% of the dense bytes,
  as the sparse-delta encodings of federated NLP do (e.g. the sub-model
  updates of Niu et al. 2020, "Billion-scale federated learning on mobile
  clients: a submodel design with tunable privacy"). A caller may pin each
  tensor's form instead (``encodings=``; :mod:`fl_node.sparse` chooses by
  measured cost per round); decoding accepts either form for any tensor.
* The content hash is SHA-256 of the exact bytes (hex string; the chain takes
  ``bytes.fromhex(h)`` as its ``bytes32``). SHA-256 is in the standard library
  and hashes at GB/s, where keccak would need an extra dependency.

Decoding never trusts the input: the safetensors header is parsed here (not by
the library, so every defect gets a sentence naming it), and anything
malformed raises :class:`CodecError`, a ``ValueError``.

A global model (plus optional server-optimizer state, e.g. FedAdam moments)
uses the same container with ``kind = "model"``; server state tensors are
stored under the ``server/`` prefix so a node that fetches the model can
continue the server optimizer deterministically.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

FORMAT = "defl/1"
INDEX_BYTES = 8  # int64 row indices
SERVER_PREFIX = "server/"
_INDICES_SUFFIX = "/indices"
_ROWS_SUFFIX = "/rows"
_METADATA_KEY = "defl"
_MAX_HEADER_BYTES = 64 * 1024 * 1024
_DTYPES = {"F32": torch.float32, "I64": torch.int64}
_DTYPE_NAMES = {torch.float32: "F32", torch.int64: "I64"}
_ITEMSIZE = {"F32": 4, "I64": 8}
_MODEL_DTYPES = (torch.float32, torch.int64)  # int64 for buffers such as BatchNorm's num_batches_tracked


class CodecError(ValueError):
    """The bytes or tensors are not a well-formed DeFL update or model."""


@dataclass(frozen=True)
class SparseRows:
    """A row-sparse delta: ``values[i]`` is row ``indices[i]`` of a tensor of ``shape``; other rows are 0.

    ``indices`` is int64, strictly increasing; the aggregator uses it to know
    which rows an update touched.
    """

    indices: Tensor
    values: Tensor
    shape: tuple[int, ...]

    def densify(self) -> Tensor:
        dense = torch.zeros(self.shape, dtype=self.values.dtype)
        if self.indices.numel():
            dense.index_copy_(0, self.indices, self.values)
        return dense

    @property
    def touched_fraction(self) -> float:
        return self.indices.numel() / self.shape[0] if self.shape[0] else 0.0


class OwnedBuffer(bytearray):
    """Bytes handed over to :func:`decode_update`: its tensors are backed by this buffer, not a copy.

    A reader that filled a fresh buffer nobody else holds (a large blob read from the swarm,
    decrypted in place) passes it as an ``OwnedBuffer`` so that an update of hundreds of MB is in
    memory once; the caller must not use the buffer after decoding it (the tensors may be updated
    in place). Any other bytes are copied, as before.
    """


UpdateValue = Tensor | SparseRows
Update = Mapping[str, UpdateValue]
Spec = Mapping[str, Sequence[int]]


def densify(value: UpdateValue) -> Tensor:
    """The dense tensor of a dense or row-sparse value."""
    return value.densify() if isinstance(value, SparseRows) else value


def value_shape(value: UpdateValue) -> tuple[int, ...]:
    return tuple(value.shape)


def _row_extremes(tensor: Tensor) -> tuple[Tensor, Tensor] | None:
    """Per-row (dim 0) minimum and maximum, or None for an empty tensor.

    One pass gives both the touched rows (min or max non-zero) and finiteness
    (NaN propagates, Inf shows at the ends); it is several times faster than
    ``isfinite().all()`` plus ``ne(0).any(dim=1)``.
    """
    if tensor.numel() == 0:
        return None
    return torch.aminmax(tensor.reshape(tensor.shape[0], -1), dim=1)


def _rows_from_extremes(extremes: tuple[Tensor, Tensor] | None) -> Tensor:
    if extremes is None:
        return torch.empty(0, dtype=torch.int64)
    low, high = extremes
    return (low.ne(0) | high.ne(0)).nonzero().flatten()  # -0.0 == 0: a row of signed zeros is untouched


def _extremes_are_finite(extremes: tuple[Tensor, Tensor] | None) -> bool:
    if extremes is None:
        return True
    low, high = extremes
    return math.isfinite(float(low.amin())) and math.isfinite(float(high.amax()))


def touched_rows(tensor: Tensor) -> Tensor:
    """Indices (int64, increasing) of the rows along dim 0 holding a non-zero value; -0.0 counts as zero."""
    if tensor.dim() < 1:
        raise CodecError("a 0-d tensor has no rows")
    return _rows_from_extremes(_row_extremes(tensor))


def to_sparse_rows(tensor: Tensor) -> SparseRows:
    """Keep only the rows (along dim 0) with a non-zero entry."""
    indices = touched_rows(tensor)
    return SparseRows(indices=indices, values=tensor.index_select(0, indices), shape=tuple(tensor.shape))


def sparse_is_smaller(touched_rows: int, shape: Sequence[int], itemsize: int = 4) -> bool:
    """Whether the sparse-rows form of a tensor takes fewer bytes than its dense form."""
    if len(shape) < 2:
        return False  # a 1-D tensor's "rows" are scalars: an index per value never pays
    row_bytes = math.prod(shape[1:]) * itemsize
    return touched_rows * (row_bytes + INDEX_BYTES) < shape[0] * row_bytes


def update_spec(global_state: Mapping[str, Tensor]) -> dict[str, tuple[int, ...]]:
    """The names and shapes an update against ``global_state`` must have: its floating-point tensors."""
    return {name: tuple(t.shape) for name, t in global_state.items() if t.is_floating_point()}


def content_hash(data: bytes) -> str:
    """SHA-256 hex digest of the encoded bytes (the chain stores ``bytes.fromhex`` of it)."""
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- encoding


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise CodecError(f"tensor name {name!r} is not a non-empty string")
    if "/" in name:
        raise CodecError(f"tensor name {name!r} contains '/', which the format reserves")
    return name


def _check_finite(name: str, tensor: Tensor) -> None:
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    low, high = torch.aminmax(tensor)  # NaN propagates to both; +-Inf shows at an end
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        raise CodecError(f"tensor {name!r} contains NaN or Inf")


def _canonical_sparse(name: str, value: SparseRows) -> SparseRows:
    """Validate a caller's SparseRows and drop zero rows so equal content encodes to equal bytes."""
    shape = tuple(int(s) for s in value.shape)
    _check_sparse_parts(name, value.indices, value.values, shape)
    if value.indices.numel() == 0:
        return SparseRows(value.indices.to(torch.int64), value.values, shape)
    compact = to_sparse_rows(value.values)
    return SparseRows(value.indices.to(torch.int64)[compact.indices], compact.values, shape)


def _save(tensors: dict[str, Tensor], header: dict) -> bytes:
    """Write the safetensors container the way ``safetensors.torch.save`` does, byte for byte.

    Same layout as the library (tensors by alignment then name, compact JSON
    header padded with spaces to 8 bytes; a test checks byte equality), but one
    copy instead of the library's two, and no per-process metadata ordering.
    """
    if sys.byteorder != "little":
        raise CodecError("safetensors data is little-endian; big-endian hosts are not supported")
    ordered = sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))
    entries: dict[str, object] = {
        "__metadata__": {_METADATA_KEY: json.dumps(header, sort_keys=True, separators=(",", ":"))}
    }
    parts: list[memoryview] = []
    offset = 0
    for key, tensor in ordered:
        tensor = tensor.detach().cpu().contiguous()
        size = tensor.numel() * tensor.element_size()
        entries[key] = {
            "dtype": _DTYPE_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        if size:
            parts.append(tensor.numpy().data)  # a view: bytes.join copies it once, into the result
        offset += size
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(8, "little"), text, *parts])


def encode_update(
    update: Update, *, allow_sparse: bool = True, encodings: Mapping[str, str] | None = None
) -> bytes:
    """Encode an update (name -> float32 delta, dense or :class:`SparseRows`) to canonical bytes.

    ``allow_sparse=False`` forces every tensor dense (for comparisons); the
    canonical form, whose hash the chain records, is the default. ``encodings``
    pins the form of named tensors, ``"dense"`` or ``"sparse_rows"`` (see
    :mod:`fl_node.sparse`, which chooses per tensor by measured cost); both
    forms are lossless, so a pinned choice changes the bytes, never the content.
    """
    if not isinstance(update, Mapping) or not update:
        raise CodecError("an update must be a non-empty mapping of name -> tensor")
    pinned = dict(encodings or {})
    for name, form in pinned.items():
        if form not in ("dense", "sparse_rows"):
            raise CodecError(f"tensor {name!r}: unknown encoding {form!r} (dense or sparse_rows)")
        if name not in update:
            raise CodecError(f"an encoding is pinned for {name!r}, which the update does not hold")
    tensors: dict[str, Tensor] = {}
    entries: dict[str, dict] = {}
    for name in sorted(update):
        _check_name(name)
        value = update[name]
        if isinstance(value, SparseRows):
            value = _canonical_sparse(name, value)
            shape, rows = value.shape, value.indices
        elif isinstance(value, Tensor):
            if value.dtype != torch.float32:
                raise CodecError(f"tensor {name!r} has dtype {value.dtype}, expected torch.float32")
            shape = tuple(value.shape)
            if value.dim() >= 2:
                extremes = _row_extremes(value)
                if not _extremes_are_finite(extremes):
                    raise CodecError(f"tensor {name!r} contains NaN or Inf")
                rows = _rows_from_extremes(extremes)
            else:
                _check_finite(name, value)
                rows = None
        else:
            raise CodecError(f"value of {name!r} is {type(value).__name__}, not a tensor or SparseRows")
        pinned_form = pinned.get(name)
        if pinned_form == "sparse_rows" and rows is None:
            raise CodecError(f"tensor {name!r} has shape {list(shape)}: sparse rows need 2 or more dims")
        if pinned_form is None:
            sparse_form = allow_sparse and rows is not None and sparse_is_smaller(rows.numel(), shape)
        else:
            sparse_form = pinned_form == "sparse_rows"
        if sparse_form and rows is not None:  # rows is never None here (checked above)
            tensors[name + _INDICES_SUFFIX] = rows
            tensors[name + _ROWS_SUFFIX] = (
                value.values if isinstance(value, SparseRows) else value.index_select(0, rows)
            )
            entries[name] = {"encoding": "sparse_rows", "shape": list(shape)}
        else:
            tensors[name] = densify(value)
            entries[name] = {"encoding": "dense", "shape": list(shape)}
    return _save(tensors, {"format": FORMAT, "kind": "update", "tensors": entries})


def encode_model(state: Mapping[str, Tensor], server_state: Mapping[str, Tensor] | None = None) -> bytes:
    """Encode a global model state (float32 / int64 tensors) and optional server-optimizer state."""
    if not isinstance(state, Mapping) or not state:
        raise CodecError("a model state must be a non-empty mapping of name -> tensor")
    tensors: dict[str, Tensor] = {}
    for prefix, part in (("", state), (SERVER_PREFIX, server_state or {})):
        for key, tensor in part.items():
            if not isinstance(key, str) or not key:
                raise CodecError(f"tensor name {key!r} is not a non-empty string")
            if not prefix and key.startswith(SERVER_PREFIX):
                raise CodecError(f"model tensor name {key!r} uses the reserved prefix {SERVER_PREFIX!r}")
            if not isinstance(tensor, Tensor):
                raise CodecError(f"value of {key!r} is {type(tensor).__name__}, not a tensor")
            if tensor.dtype not in _MODEL_DTYPES:
                raise CodecError(f"tensor {key!r} has dtype {tensor.dtype}, expected float32 or int64")
            _check_finite(key, tensor)
            tensors[prefix + key] = tensor
    return _save(tensors, {"format": FORMAT, "kind": "model"})


# ---------------------------------------------------------------- decoding


def _read_container(data: bytes, *, take: bool = False) -> tuple[dict, dict[str, Tensor]]:
    """Parse safetensors bytes strictly; return (our metadata, tensors backed by one writable copy).

    ``take`` (an :class:`OwnedBuffer` only): the tensors are backed by ``data`` itself, no copy.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise CodecError(f"blob is truncated: {len(view)} bytes, shorter than the 8-byte header length")
    header_len = int.from_bytes(view[:8], "little")
    if header_len > _MAX_HEADER_BYTES or 8 + header_len > len(view):
        raise CodecError(
            f"blob is truncated or garbage: header claims {header_len} bytes, blob has {len(view)}"
        )
    try:
        header = json.loads(bytes(view[8 : 8 + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"blob header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CodecError("blob header is not a JSON object")
    raw_meta = header.pop("__metadata__", None)
    if not isinstance(raw_meta, dict) or not isinstance(raw_meta.get(_METADATA_KEY), str):
        raise CodecError("blob has no DeFL metadata: not a DeFL update or model")
    try:
        meta = json.loads(raw_meta[_METADATA_KEY])
    except json.JSONDecodeError as exc:
        raise CodecError(f"DeFL metadata is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CodecError(f"unsupported format {meta.get('format') if isinstance(meta, dict) else meta!r}")

    body = view[8 + header_len :]
    layout = []
    for key, entry in header.items():
        if not isinstance(entry, dict):
            raise CodecError(f"header entry for {key!r} is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _DTYPES:
            raise CodecError(f"tensor {key!r} has unsupported dtype {dtype!r} (allowed: F32, I64)")
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            raise CodecError(f"tensor {key!r} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise CodecError(f"tensor {key!r} has invalid data offsets {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end or end - begin != math.prod(shape) * _ITEMSIZE[dtype]:
            raise CodecError(f"tensor {key!r}: offsets {offsets} do not match shape {shape} of {dtype}")
        if begin % _ITEMSIZE[dtype]:
            raise CodecError(f"tensor {key!r} is misaligned at offset {begin}")
        layout.append((begin, end, key, dtype, shape))
    layout.sort()
    position = 0
    for begin, end, key, _, _ in layout:
        if begin != position:
            raise CodecError(
                f"tensor {key!r} starts at {begin}, expected {position}: overlapping or gapped data"
            )
        position = end
    if position != len(body):
        raise CodecError(
            f"blob is truncated or padded: tensors need {position} data bytes, blob has {len(body)}"
        )

    buffer: bytearray
    if take and isinstance(data, OwnedBuffer):  # handed over: no second copy of a huge update
        buffer, base = data, 8 + header_len
    else:
        buffer, base = bytearray(body), 0  # one writable copy: decoded tensors may be updated in place
    tensors: dict[str, Tensor] = {}
    for begin, end, key, dtype, shape in layout:
        torch_dtype = _DTYPES[dtype]
        if end == begin:
            tensors[key] = torch.empty(shape, dtype=torch_dtype)
        else:
            count = (end - begin) // _ITEMSIZE[dtype]
            tensors[key] = torch.frombuffer(
                buffer, dtype=torch_dtype, count=count, offset=base + begin
            ).reshape(shape)
    return meta, tensors


def _check_sparse_parts(name: str, indices: Tensor, values: Tensor, shape: tuple[int, ...]) -> None:
    if len(shape) < 2:
        raise CodecError(f"sparse tensor {name!r} has shape {list(shape)}: sparse rows need 2 or more dims")
    if indices.dtype != torch.int64 or indices.dim() != 1:
        raise CodecError(f"sparse tensor {name!r}: indices must be a 1-D int64 tensor")
    if values.dtype != torch.float32:
        raise CodecError(f"sparse tensor {name!r}: rows have dtype {values.dtype}, expected torch.float32")
    if tuple(values.shape) != (indices.numel(), *shape[1:]):
        raise CodecError(
            f"sparse tensor {name!r}: rows have shape {list(values.shape)}, "
            f"expected {[indices.numel(), *shape[1:]]}"
        )
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= shape[0]:
            raise CodecError(f"sparse tensor {name!r}: row index out of range [0, {shape[0]}): {low}..{high}")
        steps = indices[1:] - indices[:-1]
        if bool((steps == 0).any()):
            raise CodecError(f"sparse tensor {name!r}: duplicate row indices")
        if bool((steps < 0).any()):
            raise CodecError(f"sparse tensor {name!r}: row indices are not sorted")
    _check_finite(name, values)


def _check_against_spec(found: Mapping[str, tuple[int, ...]], expected: Spec | None) -> None:
    if expected is None:
        return
    missing = sorted(set(expected) - set(found))
    unknown = sorted(set(found) - set(expected))
    if missing:
        raise CodecError(f"missing tensor(s): {', '.join(missing)}")
    if unknown:
        raise CodecError(f"unknown tensor(s): {', '.join(unknown)}")
    for name, shape in found.items():
        if tuple(shape) != tuple(expected[name]):
            raise CodecError(f"tensor {name!r} has shape {list(shape)}, expected {list(expected[name])}")


def check_update(update: Update, expected: Spec | None = None) -> None:
    """Validate an in-memory update the way :func:`decode_update` validates bytes; raise :class:`CodecError`."""
    if not isinstance(update, Mapping) or not update:
        raise CodecError("an update must be a non-empty mapping of name -> tensor")
    for name, value in update.items():
        _check_name(name)
        if isinstance(value, SparseRows):
            if not isinstance(value.indices, Tensor) or not isinstance(value.values, Tensor):
                raise CodecError(f"sparse tensor {name!r}: indices and rows must be tensors")
            _check_sparse_parts(name, value.indices, value.values, tuple(value.shape))
        elif isinstance(value, Tensor):
            if value.dtype != torch.float32:
                raise CodecError(f"tensor {name!r} has dtype {value.dtype}, expected torch.float32")
            _check_finite(name, value)
        else:
            raise CodecError(f"value of {name!r} is {type(value).__name__}, not a tensor or SparseRows")
    _check_against_spec({n: value_shape(v) for n, v in update.items()}, expected)


def decode_update(data: bytes, expected: Spec | None = None) -> dict[str, UpdateValue]:
    """Decode and validate update bytes; ``expected`` ({name: shape}) pins the exact names and shapes.

    Dense tensors come back as float32 tensors, sparse ones as :class:`SparseRows`. An
    :class:`OwnedBuffer` is decoded without a copy: the tensors are views of it.
    """
    meta, stored = _read_container(data, take=True)
    if meta.get("kind") != "update":
        raise CodecError(f"blob is a {meta.get('kind')!r}, not an update")
    entries = meta.get("tensors")
    if not isinstance(entries, dict) or not entries:
        raise CodecError("update metadata lists no tensors")
    update: dict[str, UpdateValue] = {}
    used: set[str] = set()
    for name, entry in entries.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            raise CodecError(f"update metadata for {name!r} has an invalid shape")
        shape = tuple(shape)
        encoding = entry.get("encoding")
        if encoding == "dense":
            keys = [name]
        elif encoding == "sparse_rows":
            keys = [name + _INDICES_SUFFIX, name + _ROWS_SUFFIX]
        else:
            raise CodecError(f"tensor {name!r} has unknown encoding {encoding!r}")
        absent = [k for k in keys if k not in stored]
        if absent:
            raise CodecError(f"missing tensor data: {', '.join(absent)}")
        used.update(keys)
        if encoding == "dense":
            tensor = stored[name]
            if tensor.dtype != torch.float32:
                raise CodecError(f"tensor {name!r} has dtype {tensor.dtype}, expected torch.float32")
            if tuple(tensor.shape) != shape:
                raise CodecError(
                    f"tensor {name!r} has shape {list(tensor.shape)}, metadata says {list(shape)}"
                )
            _check_finite(name, tensor)
            update[name] = tensor
        else:
            indices, values = stored[keys[0]], stored[keys[1]]
            _check_sparse_parts(name, indices, values, shape)
            update[name] = SparseRows(indices=indices, values=values, shape=shape)
    unknown = sorted(set(stored) - used)
    if unknown:
        raise CodecError(f"unknown tensor(s) in blob: {', '.join(unknown)}")
    _check_against_spec({n: value_shape(v) for n, v in update.items()}, expected)
    return update


def decode_model(data: bytes, expected: Spec | None = None) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Decode a global model: (state, server_state); ``expected`` pins the model's names and shapes."""
    meta, stored = _read_container(data)
    if meta.get("kind") != "model":
        raise CodecError(f"blob is a {meta.get('kind')!r}, not a model")
    state: dict[str, Tensor] = {}
    server: dict[str, Tensor] = {}
    for key in sorted(stored):
        tensor = stored[key]
        _check_finite(key, tensor)
        if key.startswith(SERVER_PREFIX):
            server[key[len(SERVER_PREFIX) :]] = tensor
        else:
            state[key] = tensor
    if not state:
        raise CodecError("model blob holds no model tensors")
    _check_against_spec({n: tuple(t.shape) for n, t in state.items()}, expected)
    return state, server
