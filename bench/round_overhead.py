"""Per-round wall time of a DeFL job, split into local training and everything else.

Run from the repository root: ``.venv/bin/python bench/round_overhead.py [--rounds N] [--dp none]``.

Four node processes on an anvil chain (backend.localnet.LocalFederation, as ``make demo``)
train the CNN on the MNIST subset (iid partitions, committee of 1, so three trainers a
round, DP-SGD at epsilon 3 unless ``--dp none``). Each round is split along its critical
path (see bench/defl_rounds.py): local training, swarm transfers, chain transactions and
reads, committee scoring, aggregation, the rest of the actions' time (model decoding,
database), and waiting between actions (agent ticks, indexing, polling).

Goal: everything but local training <= 15% of the round. The last line is one JSON
object: ``overhead_share`` over all rounds, the per-part seconds (totals and per round).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.defl_rounds import PARTS, JobSettings, as_seconds, run_job  # noqa: E402

GOAL = 0.15


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--dp", choices=("sgd", "none"), default="sgd")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--agent-interval", type=float, default=0.5, help="DEFL_AGENT_INTERVAL of the nodes")
    args = parser.parse_args(argv)
    settings = JobSettings(
        nodes=args.nodes,
        model=args.model,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        dp=args.dp,
        agent_interval=args.agent_interval,
    )
    run = run_job(settings, log=lambda line: print(line, file=sys.stderr))
    print("round   wall  " + " ".join(f"{p:>9}" for p in PARTS))
    for r in run.rounds:
        print(f"{r.round:>5} {r.wall:6.2f}  " + " ".join(f"{r.parts[p]:9.2f}" for p in PARTS))
    totals = run.totals()
    share = 1.0 - totals["train"] / totals["round"]
    print(f"overhead share {share:.1%} (goal <= {GOAL:.0%}); startup {run.startup_s:.1f}s, not counted")
    result = {
        "overhead_share": round(share, 4),
        "goal": GOAL,
        "met": share <= GOAL,
        "nodes": settings.nodes,
        "model": settings.model,
        "rounds": settings.rounds,
        "local_epochs": settings.local_epochs,
        "dp": settings.dp,
        "agent_interval": settings.agent_interval,
        **as_seconds({f"total_{k}": v for k, v in totals.items()}),
        "per_round": [
            {"round": r.round, "wall_s": round(r.wall, 3), **as_seconds(r.parts)} for r in run.rounds
        ],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
