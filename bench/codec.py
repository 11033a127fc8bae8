"""Codec size and speed: sparse-rows vs dense bytes for an embedding-heavy text-model update.

The update mimics the text model: a 50,000 x 64 embedding plus a small head.
Only the embedding rows of the tokens a trainer saw change, so we measure the
encoded size when 1%, 5% and 50% of rows change, relative to forcing every
tensor dense. Speed is measured on a dense 10M-parameter update (40 MB), in MB
of parameters per second. The last printed line is one JSON object.

Run from the repository root: ``.venv/bin/python bench/codec.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import best_time  # noqa: E402

from fl_node.codec import content_hash, decode_update, encode_update  # noqa: E402

VOCAB, EMBED_DIM, CLASSES = 50_000, 64, 4
SPEED_SHAPES = {f"layer{i}.weight": (2500, 1000) for i in range(4)}


def text_update(touched: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    embedding = torch.zeros(VOCAB, EMBED_DIM)
    rows = torch.randperm(VOCAB, generator=generator)[: int(VOCAB * touched)]
    embedding[rows] = torch.randn(len(rows), EMBED_DIM, generator=generator)
    return {
        "embedding.weight": embedding,
        "head.weight": torch.randn(CLASSES, EMBED_DIM, generator=generator),
        "head.bias": torch.randn(CLASSES, generator=generator),
    }


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    results: dict[str, float] = {}
    for percent in (1, 5, 50):
        update = text_update(percent / 100, generator)
        sparse_bytes = len(encode_update(update))
        dense_bytes = len(encode_update(update, allow_sparse=False))
        ratio = sparse_bytes / dense_bytes
        results[f"sparse_bytes_ratio_{percent}pct"] = round(ratio, 4)
        print(
            f"{percent:>3}% rows changed: sparse {sparse_bytes / 1e6:7.3f} MB, dense {dense_bytes / 1e6:7.3f} MB, ratio {ratio:.4f}"
        )
        if percent == 5:
            parameter_mb = sum(t.numel() for t in update.values()) * 4 / 1e6
            seconds = best_time(lambda update=update: encode_update(update))
            results["encode_sparse_5pct_dense_equivalent_mb_per_s"] = round(parameter_mb / seconds, 1)
            data = encode_update(update)
            seconds = best_time(lambda data=data: decode_update(data))
            results["decode_sparse_5pct_dense_equivalent_mb_per_s"] = round(parameter_mb / seconds, 1)

    dense_update = {name: torch.randn(shape, generator=generator) for name, shape in SPEED_SHAPES.items()}
    megabytes = sum(t.numel() for t in dense_update.values()) * 4 / 1e6
    encode_seconds = best_time(lambda: encode_update(dense_update))
    data = encode_update(dense_update)
    decode_seconds = best_time(lambda: decode_update(data))
    hash_seconds = best_time(lambda: content_hash(data))
    print(
        f"dense {megabytes:.0f} MB update: encode {encode_seconds * 1e3:.0f} ms, decode {decode_seconds * 1e3:.0f} ms, sha256 {hash_seconds * 1e3:.0f} ms"
    )
    results["encode_mb_per_s"] = round(megabytes / encode_seconds, 1)
    results["decode_mb_per_s"] = round(megabytes / decode_seconds, 1)
    results["sha256_mb_per_s"] = round(megabytes / hash_seconds, 1)
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
