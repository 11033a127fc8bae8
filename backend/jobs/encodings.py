"""Per round and tensor: how each update travelled (dense or a delta array), recorded for the API.

fl_node.sparse chooses the encoding per tensor and round; this node records what it sent (its
own update) and what it decoded (each accepted update of a round it aggregates), so the rounds
API and the dashboard show the choice, the density it was made on and the bytes it cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from backend.jobs.models import UpdateEncoding
from fl_node.codec import INDEX_BYTES, SparseRows, UpdateValue, touched_rows
from fl_node.sparse import TensorChoice


def _row(node: str, job_id: int, round_: int, trainer: str, tensor: str, **fields) -> UpdateEncoding:
    return UpdateEncoding(
        node=node, job_id=job_id, round=round_, trainer=trainer.lower(), tensor=tensor, **fields
    )


def record_sent(node: str, job_id: int, round_: int, choices: Mapping[str, TensorChoice]) -> None:
    """This node's own update, as fl_node.sparse chose to encode it."""
    rows = [
        _row(
            node,
            job_id,
            round_,
            node,
            name,
            encoding=choice.encoding,
            density=choice.density,
            bytes=choice.sent_bytes,
            dense_bytes=choice.dense_bytes,
        )
        for name, choice in choices.items()
    ]
    UpdateEncoding.objects.bulk_create(rows, ignore_conflicts=True)


def measure(value: UpdateValue) -> dict:
    """Encoding, density and bytes of one decoded tensor (one pass over a dense tensor's rows)."""
    shape = tuple(value.shape)
    numel = math.prod(shape)
    rows = shape[0] if shape else 1
    if isinstance(value, SparseRows):
        touched = int(value.indices.numel())
        sent = touched * (math.prod(shape[1:]) * 4 + INDEX_BYTES)
        return {"encoding": "delta", "density": touched / rows, "bytes": sent, "dense_bytes": numel * 4}
    touched = int(touched_rows(value).numel()) if value.dim() >= 1 and numel else int(bool(numel))
    return {
        "encoding": "dense",
        "density": touched / rows if rows else 0.0,
        "bytes": numel * 4,
        "dense_bytes": numel * 4,
    }


def record_received(
    node: str, job_id: int, round_: int, updates: Mapping[str, Mapping[str, UpdateValue]]
) -> None:
    """Each decoded update of a round (trainer -> tensors), as its trainer chose to encode it."""
    rows = [
        _row(node, job_id, round_, trainer, name, **measure(value))
        for trainer, update in updates.items()
        for name, value in sorted(update.items())
    ]
    UpdateEncoding.objects.bulk_create(rows, ignore_conflicts=True)


def round_encodings(node: str, job_id: int) -> dict[int, dict[str, dict]]:
    """round -> {"updates": trainer -> tensor -> record, "tensors": tensor -> summary over updates}."""
    out: dict[int, dict[str, dict]] = {}
    for row in UpdateEncoding.objects.filter(node=node, job_id=job_id).order_by("round", "trainer", "tensor"):
        entry = out.setdefault(row.round, {"updates": {}, "tensors": {}})
        entry["updates"].setdefault(row.trainer, {})[row.tensor] = {
            "encoding": row.encoding,
            "density": round(row.density, 6),
            "bytes": row.bytes,
            "dense_bytes": row.dense_bytes,
        }
        summary = entry["tensors"].setdefault(
            row.tensor, {"dense": 0, "delta": 0, "density": 0.0, "bytes": 0, "dense_bytes": 0}
        )
        summary[row.encoding] += 1
        summary["density"] += row.density
        summary["bytes"] += row.bytes
        summary["dense_bytes"] += row.dense_bytes
    for entry in out.values():
        for summary in entry["tensors"].values():
            summary["density"] = round(summary["density"] / (summary["dense"] + summary["delta"]), 6)
    return out
