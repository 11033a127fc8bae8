"""How large a blob of codec.py's encodings can be, from the model's tensors alone.

Every read of a model or an update names the largest blob it accepts, refused from the blob's
root chunk before its data is fetched: a reference on chain is written by another member, who
may point it at a blob of any size. The node's job blobs (backend.jobs.blobs) and its model
registry (backend.serving.blobs) both bound their reads with these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fl_node.codec import INDEX_BYTES, update_spec

# safetensors header (names, shapes, offsets as JSON) and metadata around the tensors.
CODEC_SLACK_BYTES = 1 << 20
# A global model carries its weights and the server optimiser's state (e.g. FedAdam's
# two moments) of the same shapes: three copies at most.
_MODEL_COPIES = 3


def update_max_bytes(global_state: Mapping) -> int:
    """The largest encoded update of the model whose weights are ``global_state``.

    4 bytes a parameter of the update's spec (float32), plus an 8-byte row id per row of each
    tensor of 2+ dims (a job's sparse policy may send a dense table as a delta array:
    fl_node.sparse), plus the codec's header.
    """
    shapes = update_spec(global_state).values()
    rows = sum(INDEX_BYTES * shape[0] for shape in shapes if len(shape) >= 2)
    return 4 * sum(math.prod(shape) for shape in shapes) + rows + CODEC_SLACK_BYTES


def model_max_bytes(state: Mapping) -> int:
    """The largest encoded global model whose module has the tensors of ``state`` (a state_dict)."""
    weights = sum(t.numel() * t.element_size() for t in state.values())
    return _MODEL_COPIES * weights + CODEC_SLACK_BYTES
