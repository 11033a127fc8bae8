"""DP-SGD step time over non-private step time on the CNN, per Opacus grad-sample mode.

Run from the repository root: ``.venv/bin/python bench/dp_overhead.py [--threads N] [--steps N]``.

Both sides train the same model on the same MNIST batch in the same process,
with the same torch thread count; steps are interleaved (plain, hooks, ew,
functorch, ghost, plain, ...) after a warm-up, so drift in machine load hits every
side alike, and the median step time is compared. A DP step is exactly what
``train_local`` runs: forward and backward through the grad-sample wrapper,
per-example clipping, Gaussian noise, the SGD update. The goal is <= 1.3x;
Opacus's own CPU anchor is about 1.6x.

The last line printed is one JSON object with ``dp_step_ratio`` (the best mode
on the default model) and every configuration's per-mode ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_node.data import load_dataset  # noqa: E402
from fl_node.models import create_model  # noqa: E402
from fl_node.train import DEFAULT_GRAD_SAMPLE_MODE, GRAD_SAMPLE_MODES  # noqa: E402

Step = Callable[[], None]
# train_local's modes, plus ghost clipping, measured for comparison only (train_local does not offer it).
MEASURED_MODES = (*GRAD_SAMPLE_MODES, "ghost")

# (label, model options, batch size): the default CNN first; its best mode is the headline figure.
CONFIGS = [
    ("cnn b64", {}, 64),
    ("cnn b128", {}, 128),
    ("cnn without groupnorm b64", {"groups": 0}, 64),
    ("cnn without groupnorm b128", {"groups": 0}, 128),
]


def plain_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def dp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str) -> Step:
    wrapped = prepare_module(model, mode)
    optimizer = DPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=len(y),
        generator=torch.Generator().manual_seed(0),
    )

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(wrapped(x), y).backward()
        optimizer.step()

    return step


def ghost_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Step:
    """Ghost clipping (Li et al. 2022; Bu et al. 2023): norms without per-example gradients, two backwards."""
    wrapped = prepare_module(model, "ghost", max_grad_norm=1.0)
    optimizer = DPOptimizerFastGradientClipping(
        torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=len(y),
        generator=torch.Generator().manual_seed(0),
    )
    criterion = DPLossFastGradientClipping(wrapped, optimizer, nn.CrossEntropyLoss(), "mean")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        criterion(wrapped(x), y).backward()
        optimizer.step()

    return step


def measure(steps: dict[str, Step], *, repeats: int, warmup: int) -> dict[str, float]:
    """Median seconds per step, the candidates interleaved round-robin."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_config(options: dict, batch_size: int, *, repeats: int, warmup: int) -> dict[str, float]:
    data = load_dataset("mnist", seed=0)
    x, y = (t[:batch_size] for t in data.train.tensors())
    base = create_model("cnn", seed=0, **data.model_kwargs(), **options)
    steps = {"plain": plain_step(copy.deepcopy(base), x, y)}
    for mode in GRAD_SAMPLE_MODES:
        steps[mode] = dp_step(copy.deepcopy(base), x, y, mode)
    steps["ghost"] = ghost_step(copy.deepcopy(base), x, y)
    medians = measure(steps, repeats=repeats, warmup=warmup)
    return {"plain_ms": medians["plain"] * 1e3} | {
        mode: medians[mode] / medians["plain"] for mode in MEASURED_MODES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every side (default 1)")
    parser.add_argument("--steps", type=int, default=40, help="measured steps per side and configuration")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*(Secure RNG|backward hook).*")

    results: dict[str, dict[str, float]] = {}
    for label, options, batch_size in CONFIGS:
        print(
            f"measuring {label}: plain vs {', '.join(MEASURED_MODES)} ({args.steps} steps each)...",
            flush=True,
        )
        figures = bench_config(options, batch_size, repeats=args.steps, warmup=5)
        results[label] = figures
        ratios = ", ".join(f"{mode} {figures[mode]:.2f}x" for mode in MEASURED_MODES)
        print(f"  plain step {figures['plain_ms']:.2f} ms; DP/plain: {ratios}", flush=True)

    headline = results[CONFIGS[0][0]]
    # The headline is what train_local can run: the best of its own modes.
    best_mode = min(GRAD_SAMPLE_MODES, key=lambda mode: headline[mode])
    summary = {
        "dp_step_ratio": round(headline[best_mode], 3),
        "best_mode": best_mode,
        "library_default_mode": DEFAULT_GRAD_SAMPLE_MODE,
        "goal": 1.3,
        "threads": args.threads,
        "configs": {
            label: {k: round(v, 3) for k, v in figures.items()} for label, figures in results.items()
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
