"""Aggregation throughput: 10 updates of a 10M-parameter model (4 tensors of 2.5M) for every strategy.

Throughput counts the parameter bytes read: 10 updates x 40 MB = 400 MB per
aggregation. The goal for FedAvg is >= 1 GB/s on a 2-core machine. The last
printed line is one JSON object.

Run from the repository root: ``.venv/bin/python bench/aggregate.py [--threads N]``. On a
shared 2-core machine ``--threads 1`` gives steadier figures: torch's intra-op threads
stall whenever another process holds a core.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import best_time  # noqa: E402

from fl_node.aggregate import WeightedUpdate, get_strategy  # noqa: E402

NUM_UPDATES = 10
SHAPES = {f"layer{i}.weight": (2500, 1000) for i in range(4)}  # 4 x 2.5M = 10M parameters
STRATEGIES = {
    "fedavg": {},
    "fedprox": {},
    "hybrid": {},
    "fedadam": {},
    "fedyogi": {},
    "median": {},
    "trimmed_mean": {"beta": 0.2},
    "krum": {"f": 2},
    "multi_krum": {"f": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    global_state = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
    updates = [
        WeightedUpdate(
            {name: torch.randn(shape, generator=generator) * 0.01 for name, shape in SHAPES.items()},
            num_samples=100 + 10 * i,
            id=f"{i:064x}",
        )
        for i in range(NUM_UPDATES)
    ]
    parameters = sum(t.numel() for t in global_state.values())
    megabytes = NUM_UPDATES * parameters * 4 / 1e6
    print(
        f"torch threads: {torch.get_num_threads()}; {NUM_UPDATES} updates x {parameters / 1e6:.1f}M parameters"
    )
    results: dict[str, float] = {}
    # Side-by-side references, so a loaded machine shows up as a low ratio instead of a false verdict:
    # copying the same bytes once (memory bandwidth), and the textbook stack-then-reduce FedAvg.
    sources = [u.update[name] for u in updates for name in SHAPES]
    targets = [torch.empty_like(t) for t in sources]
    copy_seconds = best_time(lambda: [t.copy_(s) for t, s in zip(targets, sources, strict=True)])
    targets.clear()
    weights = torch.tensor([u.num_samples for u in updates], dtype=torch.float32)
    weights /= weights.sum()

    def naive_fedavg() -> None:
        for name in SHAPES:
            stacked = torch.stack([u.update[name] for u in updates])
            global_state[name] + torch.tensordot(weights, stacked, dims=1)

    naive_seconds = best_time(naive_fedavg)
    results["memcpy_gb_per_s"] = round(megabytes / 1e3 / copy_seconds, 3)
    results["naive_stack_fedavg_gb_per_s"] = round(megabytes / 1e3 / naive_seconds, 3)
    print(f"{'memcpy':>13}: {copy_seconds * 1e3:8.1f} ms  {megabytes / copy_seconds:8.0f} MB/s")
    print(f"{'naive fedavg':>13}: {naive_seconds * 1e3:8.1f} ms  {megabytes / naive_seconds:8.0f} MB/s")
    for name, params in STRATEGIES.items():
        strategy = get_strategy(name, **params)
        seconds = best_time(lambda strategy=strategy: strategy.aggregate(global_state, updates))
        results[f"{name}_gb_per_s"] = round(megabytes / 1e3 / seconds, 3)
        print(f"{name:>13}: {seconds * 1e3:8.1f} ms  {megabytes / seconds:8.0f} MB/s")
    results["aggregate_gb_per_s"] = results["fedavg_gb_per_s"]
    results["fedavg_vs_memcpy"] = round(results["fedavg_gb_per_s"] / results["memcpy_gb_per_s"], 3)
    results["fedavg_vs_naive"] = round(results["fedavg_gb_per_s"] / results["naive_stack_fedavg_gb_per_s"], 3)
    results["goal_gb_per_s"] = 1.0
    results["torch_threads"] = torch.get_num_threads()
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
