"""A committee score's time with fl_node.layers.MaxPool2d against torch's nn.MaxPool2d.

Run from the repository root: ``.venv/bin/python bench/eval_pool.py [--records N] [--reps N]``.

The CNN of the round benchmarks scores one update (fl_node.score.score_update_int: decode, merge,
evaluate with the count noised) on ``--records`` MNIST-subset records, one torch thread, as a
node process runs (OMP_NUM_THREADS=1). The same model is timed with its pools swapped for torch's
own, the two sides interleaved one for one so the machine's load hits both alike; the pooling
alone is timed the same way on the first pool's input. The scores of the two sides are checked
equal (the noise is drawn from one fixed seed for both). The last line is one JSON object:
``score_ms`` and ``score_ms_torch_pool`` (medians), ``score_speedup`` (their ratio), the same
for the pooling alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fl_node import layers  # noqa: E402
from fl_node.codec import encode_update  # noqa: E402
from fl_node.data import load_dataset  # noqa: E402
from fl_node.models import create_model  # noqa: E402
from fl_node.score import score_update_int  # noqa: E402
from fl_node.secure_random import TorchRandom  # noqa: E402


def with_torch_pools(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose fl_node pools are torch's nn.MaxPool2d with the same options."""
    import copy

    twin = copy.deepcopy(model)
    for module in list(twin.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, layers.MaxPool2d):
                setattr(module, child_name, nn.MaxPool2d(child.kernel_size, child.stride))
    return twin


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=180, help="validation records (a node's 20%% of 900)")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    splits = load_dataset("mnist", seed=0)
    x_val, y_val = (t[: args.records] for t in splits.test.tensors())
    ours = create_model("cnn", **splits.model_kwargs())
    theirs = with_torch_pools(ours)
    global_state = {k: v.clone() for k, v in ours.state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    update = {
        k: torch.randn(v.shape, generator=generator) * 0.01
        for k, v in global_state.items()
        if v.is_floating_point()
    }
    blob = encode_update(update)

    def score(model):
        return score_update_int(
            model,
            global_state,
            blob,
            x_val,
            y_val,
            noise_multiplier=1.0,
            randomness=TorchRandom(torch.Generator().manual_seed(7)),
        )

    if score(ours) != score(theirs):
        raise SystemExit("the two pools gave different scores")
    pool_input = ours[0][:3](x_val).detach()  # the first pool's input (after conv, norm, tanh)
    sides = {"ours": [], "torch": [], "pool_ours": [], "pool_torch": []}
    for _ in range(3):  # warm-up
        score(ours), score(theirs)
    with torch.no_grad():
        for _ in range(args.reps):
            sides["ours"] += timed(lambda: score(ours), 1)
            sides["torch"] += timed(lambda: score(theirs), 1)
            sides["pool_ours"] += timed(lambda: layers.MaxPool2d(2, 1)(pool_input), 1)
            sides["pool_torch"] += timed(lambda: nn.MaxPool2d(2, 1)(pool_input), 1)
    med = {k: statistics.median(v) for k, v in sides.items()}
    result = {
        "records": args.records,
        "score_ms": round(med["ours"], 2),
        "score_ms_torch_pool": round(med["torch"], 2),
        "score_speedup": round(med["torch"] / med["ours"], 2),
        "pool_ms": round(med["pool_ours"], 3),
        "pool_ms_torch": round(med["pool_torch"], 3),
        "pool_speedup": round(med["pool_torch"] / med["pool_ours"], 1),
    }
    print(f"score: {result['score_ms']} ms against {result['score_ms_torch_pool']} ms with torch's pools")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
