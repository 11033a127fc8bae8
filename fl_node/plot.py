"""Plots people would rather see than read: accuracy and epsilon per round."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def plot_rounds(result: dict, path: Path) -> Path:
    rounds = [r["round"] for r in result["rounds"]]
    accuracy = [r["test_accuracy"] for r in result["rounds"]]
    epsilon = [r["epsilon_rdp"] for r in result["rounds"]]
    fig, left = plt.subplots(figsize=(7, 4), dpi=120)
    left.plot(rounds, accuracy, marker="o", color="tab:blue", label="test accuracy")
    left.set_xlabel("round")
    left.set_ylabel("test accuracy", color="tab:blue")
    left.set_ylim(0, 1)
    left.grid(alpha=0.3)
    right = left.twinx()
    right.plot(rounds, epsilon, marker="s", color="tab:red", label="epsilon (RDP)")
    right.set_ylabel("epsilon spent (RDP)", color="tab:red")
    config = result["config"]
    left.set_title(
        f"{config['dataset']} · {config['nodes']} nodes · {config['partition']} · "
        f"{config['job']['strategy']} · attack {config['attack'] or 'none'}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
