"""fl_node.codec: canonical bytes, dense / sparse-rows choice, and rejection of malformed input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from fl_node.codec import (
    CodecError,
    SparseRows,
    check_update,
    content_hash,
    decode_model,
    decode_update,
    encode_model,
    encode_update,
    sparse_is_smaller,
    to_sparse_rows,
    update_spec,
)

REPO = Path(__file__).resolve().parents[2]


def embedding_update(vocab: int = 1000, dim: int = 16, touched: float = 0.02, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.zeros(vocab, dim)
    rows = torch.randperm(vocab, generator=generator)[: int(vocab * touched)]
    embedding[rows] = torch.randn(len(rows), dim, generator=generator)
    return {
        "embedding.weight": embedding,
        "head.weight": torch.randn(3, dim, generator=generator),
        "head.bias": torch.randn(3, generator=generator),
    }


def spec_of(update: dict) -> dict:
    return {name: tuple(t.shape) for name, t in update.items()}


def raw_blob(tensors: dict, entries: dict, kind: str = "update") -> bytes:
    """A container written the codec's way but with arbitrary (possibly bad) content."""
    header = {"format": "defl/1", "kind": kind, "tensors": entries}
    return safetensors.torch.save(tensors, metadata={"defl": json.dumps(header, sort_keys=True)})


def sparse_blob(indices: torch.Tensor, rows: torch.Tensor, shape: list[int]) -> bytes:
    return raw_blob(
        {"e/indices": indices, "e/rows": rows},
        {"e": {"encoding": "sparse_rows", "shape": shape}},
    )


# ------------------------------------------------------------------ round trips


def test_dense_round_trip_is_exact():
    update = {"w": torch.randn(5, 4), "b": torch.randn(4), "scalar": torch.tensor(2.5)}
    decoded = decode_update(encode_update(update), expected=spec_of(update))
    assert set(decoded) == set(update)
    for name, tensor in update.items():
        assert isinstance(decoded[name], torch.Tensor)
        assert torch.equal(decoded[name], tensor)


def test_sparse_round_trip_reports_touched_rows():
    update = embedding_update(touched=0.02)
    decoded = decode_update(encode_update(update), expected=spec_of(update))
    embedding = decoded["embedding.weight"]
    assert isinstance(embedding, SparseRows)
    expected_rows = update["embedding.weight"].ne(0).any(dim=1).nonzero().flatten()
    assert torch.equal(embedding.indices, expected_rows)
    assert torch.equal(embedding.densify(), update["embedding.weight"])
    assert isinstance(decoded["head.weight"], torch.Tensor)  # fully dense: stays dense


def test_decoded_tensors_are_writable_copies():
    data = encode_update({"w": torch.ones(3, 3)})
    decoded = decode_update(data)
    decoded["w"].add_(1.0)  # must not write into the immutable input bytes
    assert torch.equal(decode_update(data)["w"], torch.ones(3, 3))


def test_sparse_input_encodes_like_its_dense_form():
    update = embedding_update(touched=0.05)
    sparse = to_sparse_rows(update["embedding.weight"])
    # A caller's SparseRows may carry zero rows; they are dropped so bytes depend on content only.
    padded = SparseRows(
        indices=torch.cat([sparse.indices, torch.tensor([999])]),
        values=torch.cat([sparse.values, torch.zeros(1, 16)]),
        shape=sparse.shape,
    )
    assert 999 not in sparse.indices.tolist()
    as_sparse = {**update, "embedding.weight": padded}
    assert encode_update(as_sparse) == encode_update(update)


def test_dense_encoding_chosen_when_most_rows_change():
    update = embedding_update(touched=0.99)
    decoded = decode_update(encode_update(update))
    assert isinstance(decoded["embedding.weight"], torch.Tensor)


def test_sparse_only_when_smaller():
    assert sparse_is_smaller(10, (1000, 16))
    assert not sparse_is_smaller(1000, (1000, 16))
    assert not sparse_is_smaller(1, (1000,))  # 1-D tensors always dense
    # Break-even: 64 bytes per row + 8 per index -> sparse only below 64/72 of the rows.
    assert sparse_is_smaller(888, (1000, 16)) and not sparse_is_smaller(889, (1000, 16))


def test_sparse_bytes_scale_with_touched_rows():
    dense_bytes = 1000 * 16 * 4
    sizes = {}
    for fraction in (0.01, 0.02, 0.10, 0.50):
        update = {"embedding.weight": embedding_update(touched=fraction)["embedding.weight"]}
        sizes[fraction] = len(encode_update(update))
    assert sizes[0.01] < sizes[0.02] < sizes[0.10] < sizes[0.50] < dense_bytes
    assert sizes[0.02] < 0.04 * dense_bytes  # ~2% of rows cost ~2% of the dense bytes (+ index, header)
    assert sizes[0.50] < 0.6 * dense_bytes


def test_model_round_trip_with_server_state_and_int_buffers():
    state = {"layer.weight": torch.randn(3, 2), "bn.num_batches_tracked": torch.tensor(7)}
    server = {"m/layer.weight": torch.zeros(3, 2), "v/layer.weight": torch.full((3, 2), 1e-6)}
    data = encode_model(state, server)
    loaded, loaded_server = decode_model(data, expected=spec_of(state))
    assert set(loaded) == set(state) and set(loaded_server) == set(server)
    assert torch.equal(loaded["layer.weight"], state["layer.weight"])
    assert loaded["bn.num_batches_tracked"].dtype == torch.int64
    assert torch.equal(loaded_server["v/layer.weight"], server["v/layer.weight"])
    assert encode_model(loaded, loaded_server) == data


def test_update_spec_keeps_floating_tensors():
    state = {"w": torch.zeros(2, 3), "steps": torch.tensor(1)}
    assert update_spec(state) == {"w": (2, 3)}


def test_content_hash_is_sha256_hex():
    data = encode_update({"w": torch.ones(2)})
    digest = content_hash(data)
    assert len(bytes.fromhex(digest)) == 32
    assert digest != content_hash(encode_update({"w": torch.zeros(2)}))


# ------------------------------------------------------------------ determinism

_HASH_IN_CHILD = """
import torch, sys
sys.path.insert(0, {repo!r})
from fl_node.codec import content_hash, encode_update
g = torch.Generator().manual_seed(1)
emb = torch.zeros(300, 8); emb[[5, 17, 250]] = torch.randn(3, 8, generator=g)
update = {{"z.bias": torch.randn(4, generator=g), "a.weight": torch.randn(4, 8, generator=g), "emb": emb}}
print(content_hash(encode_update(update)))
"""


@pytest.mark.slow  # two interpreters of their own, importing torch
def test_encoding_is_identical_across_processes():
    script = _HASH_IN_CHILD.format(repo=str(REPO))
    children = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    hashes = {child.communicate(timeout=120)[0].strip() for child in children}
    assert all(child.returncode == 0 for child in children)
    generator = torch.Generator().manual_seed(1)
    emb = torch.zeros(300, 8)
    emb[[5, 17, 250]] = torch.randn(3, 8, generator=generator)
    bias = torch.randn(4, generator=generator)
    weight = torch.randn(4, 8, generator=generator)
    # Insertion order differs from the child's: keys are sorted before encoding.
    local = content_hash(encode_update({"emb": emb, "a.weight": weight, "z.bias": bias}))
    assert hashes == {local}


# ------------------------------------------------------------------ malformed input


def test_codec_error_is_value_error():
    assert issubclass(CodecError, ValueError)


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"w": torch.tensor([1.0, float("nan")])}, "NaN or Inf"),
        ({"w": torch.tensor([float("inf"), 0.0])}, "NaN or Inf"),
        ({"w": torch.ones(2, dtype=torch.float64)}, "dtype"),
        ({"w": torch.ones(2, dtype=torch.int64)}, "dtype"),
        ({"a/b": torch.ones(2)}, "reserves"),
        ({"w": [1.0, 2.0]}, "not a tensor"),
        ({}, "non-empty"),
    ],
)
def test_encode_rejects_bad_updates(update, message):
    with pytest.raises(CodecError, match=message):
        encode_update(update)


def test_decode_checks_expected_spec():
    data = encode_update({"w": torch.ones(2, 3), "b": torch.ones(3)})
    with pytest.raises(CodecError, match=r"tensor 'w' has shape \[2, 3\], expected \[3, 2\]"):
        decode_update(data, expected={"w": (3, 2), "b": (3,)})
    with pytest.raises(CodecError, match="missing tensor.*extra"):
        decode_update(data, expected={"w": (2, 3), "b": (3,), "extra": (1,)})
    with pytest.raises(CodecError, match="unknown tensor.*b"):
        decode_update(data, expected={"w": (2, 3)})


def test_decode_checks_sparse_shape_against_spec():
    update = embedding_update(touched=0.02)
    data = encode_update(update)
    wrong = {**spec_of(update), "embedding.weight": (999, 16)}
    with pytest.raises(CodecError, match="embedding.weight"):
        decode_update(data, expected=wrong)


def test_decode_rejects_truncated_blobs():
    data = encode_update(embedding_update(touched=0.05))
    for cut in (0, 4, 8, 20, len(data) // 2, len(data) - 1):
        with pytest.raises(CodecError, match="truncated"):
            decode_update(data[:cut])


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 64,
        b"hello world, definitely not tensors",
        (10).to_bytes(8, "little") + b"not json!!",
        (2).to_bytes(8, "little") + b"[]",
        (2).to_bytes(8, "little") + b"{}",
    ],
)
def test_decode_rejects_garbage(garbage):
    with pytest.raises(CodecError):
        decode_update(garbage)


def test_decode_rejects_non_bytes():
    with pytest.raises(CodecError, match="expected bytes"):
        decode_update("not bytes")  # type: ignore[arg-type]


def test_decode_rejects_foreign_safetensors():
    with pytest.raises(CodecError, match="no DeFL metadata"):
        decode_update(safetensors.torch.save({"w": torch.ones(2)}))


def test_decode_rejects_model_as_update_and_back():
    with pytest.raises(CodecError, match="not an update"):
        decode_update(encode_model({"w": torch.ones(2)}))
    with pytest.raises(CodecError, match="not a model"):
        decode_model(encode_update({"w": torch.ones(2)}))


def test_decode_rejects_nan_smuggled_into_bytes():
    data = bytearray(encode_update({"w": torch.zeros(4)}))
    data[-4:] = torch.tensor([float("nan")]).numpy().tobytes()
    with pytest.raises(CodecError, match="NaN or Inf"):
        decode_update(bytes(data))


def test_decode_rejects_wrong_dtype_in_blob():
    data = raw_blob({"w": torch.ones(2, dtype=torch.int64)}, {"w": {"encoding": "dense", "shape": [2]}})
    with pytest.raises(CodecError, match="dtype"):
        decode_update(data)
    data = raw_blob({"w": torch.ones(2, dtype=torch.float64)}, {"w": {"encoding": "dense", "shape": [2]}})
    with pytest.raises(CodecError, match="unsupported dtype"):
        decode_update(data)


def test_decode_rejects_unknown_and_missing_tensor_data():
    extra = raw_blob(
        {"w": torch.ones(2), "sneaky": torch.ones(1)},
        {"w": {"encoding": "dense", "shape": [2]}},
    )
    with pytest.raises(CodecError, match="unknown tensor.*sneaky"):
        decode_update(extra)
    missing = raw_blob(
        {"w": torch.ones(2)},
        {"w": {"encoding": "dense", "shape": [2]}, "v": {"encoding": "dense", "shape": [1]}},
    )
    with pytest.raises(CodecError, match="missing tensor data: v"):
        decode_update(missing)


def test_decode_rejects_bad_sparse_indices():
    rows = torch.ones(2, 4)
    with pytest.raises(CodecError, match="out of range"):
        decode_update(sparse_blob(torch.tensor([3, 10]), rows, [10, 4]))
    with pytest.raises(CodecError, match="out of range"):
        decode_update(sparse_blob(torch.tensor([-1, 3]), rows, [10, 4]))
    with pytest.raises(CodecError, match="duplicate"):
        decode_update(sparse_blob(torch.tensor([3, 3]), rows, [10, 4]))
    with pytest.raises(CodecError, match="not sorted"):
        decode_update(sparse_blob(torch.tensor([5, 3]), rows, [10, 4]))
    with pytest.raises(CodecError, match="rows have shape"):
        decode_update(sparse_blob(torch.tensor([1, 3]), torch.ones(2, 5), [10, 4]))
    with pytest.raises(CodecError, match="indices must be"):
        decode_update(sparse_blob(torch.tensor([1, 3], dtype=torch.float32), rows, [10, 4]))


def test_decode_rejects_unknown_encoding():
    data = raw_blob({"w": torch.ones(2)}, {"w": {"encoding": "zip", "shape": [2]}})
    with pytest.raises(CodecError, match="unknown encoding 'zip'"):
        decode_update(data)


def test_decode_rejects_inconsistent_dense_shape():
    data = raw_blob({"w": torch.ones(2, 3)}, {"w": {"encoding": "dense", "shape": [3, 2]}})
    with pytest.raises(CodecError, match="metadata says"):
        decode_update(data)


def test_decode_rejects_overlapping_offsets():
    data = bytearray(encode_update({"a": torch.ones(2), "b": torch.ones(2)}))
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    header["b"]["data_offsets"] = header["a"]["data_offsets"]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(header_len)
    assert len(text) == header_len
    data[8 : 8 + header_len] = text
    with pytest.raises(CodecError, match="overlapping|truncated"):
        decode_update(bytes(data))


def test_check_update_validates_in_memory_updates():
    check_update({"w": torch.ones(2)}, expected={"w": (2,)})
    bad_rows = SparseRows(torch.tensor([50]), torch.zeros(1, 4), (10, 4))
    with pytest.raises(CodecError, match="out of range"):
        check_update({"e": bad_rows})
    with pytest.raises(CodecError, match="NaN or Inf"):
        check_update({"w": torch.tensor([float("nan")])})
    with pytest.raises(CodecError, match="unknown tensor"):
        check_update({"w": torch.ones(2), "x": torch.ones(1)}, expected={"w": (2,)})


def test_container_is_byte_identical_to_the_safetensors_library():
    update = {**embedding_update(touched=0.05), "scalar": torch.tensor(1.5), "empty": torch.zeros(0, 3)}
    for data in (
        encode_update(update),
        encode_model({"w": torch.randn(4, 2), "n": torch.tensor(3)}, {"m/w": torch.ones(4, 2)}),
    ):
        header_len = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8 : 8 + header_len])["__metadata__"]
        loaded = safetensors.torch.load(data)
        assert safetensors.torch.save(loaded, metadata=metadata) == data
