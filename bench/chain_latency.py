"""What a real block time does to a round: the same small job at block times 0, 1, 2 and 5 s.

Run from the repository root: ``.venv/bin/python bench/chain_latency.py [--rounds N]``.

Workload: the demo's job (the MLP on the MNIST subset, DP-SGD at epsilon 3, one local epoch),
5 nodes and the production committee of 3 (odd and at least 3: the contracts are deployed
without the development flag for small committees). It runs on anvil mining each transaction
at once (block time 0) and every 1, 2 and 5 s (``--block-time``), and on the consortium chain
(one Clique validator per node, the EthereumJS client, 2 s; each node reads its own validator,
with the confirmations a validator chain gets by default) unless ``--no-consortium``.

Per block time it prints the blocks a round takes (from the block of the transaction that fixed
the previous round's model to the one that fixed this round's; round 1, which also holds the
start and the committee's draw, is left out), its seconds, and the round's wall time over its
local training time (the training on the round's critical path). All of a round's transactions
wait for blocks, so at a real block time the round is mostly blocks: the figure to watch is
``blocks_per_round_2s`` (goal: at most 3), with ``round_time_over_training_2s`` beside it.

The last line is one JSON object: per block time its figures, and ``blocks_per_round_2s``,
``round_time_over_training_2s`` (anvil at 2 s) and ``blocks_per_round_consortium_2s``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.defl_rounds import JobSettings, median, run_job  # noqa: E402

BLOCK_TIMES = (0.0, 1.0, 2.0, 5.0)
GOAL_BLOCKS_PER_ROUND = 3


def round_blocks(rounds: list[dict]) -> dict[int, int]:
    """Round -> the block of its last transaction (the vote that fixed its model), from one
    node's /api/jobs/{id}/rounds; rounds without transactions are left out."""
    ends = {}
    for r in rounds:
        blocks = [t["block"] for t in r.get("transactions") or [] if t.get("block") is not None]
        if blocks:
            ends[int(r["round"])] = max(blocks)
    return ends


def measure(settings: JobSettings, log) -> dict:
    run = run_job(settings, log=log)
    node_rounds = next(iter(r for key, r in run.raw.items() if key != "t0"))
    ends = round_blocks(node_rounds)  # type: ignore[arg-type]
    steady = [n for n in sorted(ends) if n > 1 and n - 1 in ends]
    blocks = {n: ends[n] - ends[n - 1] for n in steady}
    walls = {s.round: s.wall for s in run.rounds}
    trains = {s.round: s.parts.get("train", 0.0) for s in run.rounds}
    per_round = [
        {
            "round": n,
            "blocks": blocks[n],
            "seconds": round(walls.get(n, float("nan")), 2),
            "training_s": round(trains.get(n, float("nan")), 3),
        }
        for n in steady
    ]
    ratio = [walls[n] / trains[n] for n in steady if trains.get(n)]
    return {
        "blocks_per_round": median(blocks.values()),
        "seconds_per_round": round(median(walls[n] for n in steady if n in walls), 2),
        "round_time_over_training": round(median(ratio), 2),
        "rounds": per_round,
        "startup_s": round(run.startup_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds per job (round 1 is not measured)")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--committee", type=int, default=3)
    parser.add_argument("--block-times", default=",".join(f"{t:g}" for t in BLOCK_TIMES))
    parser.add_argument("--no-consortium", action="store_true", help="skip the consortium chain at 2 s")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 holds the job's start)")
    try:
        block_times = [float(t) for t in args.block_times.split(",")]
    except ValueError:
        parser.error("--block-times is a comma-separated list of seconds")
    if any(not 0 <= t <= 60 for t in block_times):
        parser.error("each block time is between 0 and 60 s")
    base = JobSettings(
        nodes=args.nodes, model="mlp", rounds=args.rounds, committee=args.committee, local_epochs=1
    )
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731 - progress, not results

    results: dict[str, dict] = {}
    runs = [("anvil", t) for t in block_times] + ([] if args.no_consortium else [("consortium", 2.0)])
    for chain, block_time in runs:
        key = f"{chain}_{block_time:g}s"
        started = time.monotonic()
        settings = JobSettings(**{**base.__dict__, "chain": chain, "block_time": block_time or None})
        try:
            results[key] = measure(settings, log)
        except Exception as exc:  # noqa: BLE001 - one chain that fails leaves the others' figures
            results[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"{chain:>10} block time {block_time:>3g} s: failed ({results[key]['error']})", flush=True)
            continue
        figures = results[key]
        print(
            f"{chain:>10} block time {block_time:>3g} s: {figures['blocks_per_round']:>5.1f} blocks a round, "
            f"{figures['seconds_per_round']:>6.2f} s a round, round/training {figures['round_time_over_training']:>6.2f}"
            f"  ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    summary = {
        "workload": f"mlp, {args.nodes} nodes, committee {args.committee}, {args.rounds} rounds (round 1 not measured)",
        "by_block_time": results,
        "blocks_per_round_2s": results.get("anvil_2s", {}).get("blocks_per_round"),
        "round_time_over_training_2s": results.get("anvil_2s", {}).get("round_time_over_training"),
        "blocks_per_round_consortium_2s": results.get("consortium_2s", {}).get("blocks_per_round"),
        "round_time_over_training_consortium_2s": results.get("consortium_2s", {}).get(
            "round_time_over_training"
        ),
        "goal_blocks_per_round": GOAL_BLOCKS_PER_ROUND,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
