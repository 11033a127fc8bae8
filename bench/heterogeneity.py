"""Unequal members and shared devices (issue #18): AIMD-adaptive work and greedy placement with overlap.

Run from the repository root: ``.venv/bin/python bench/heterogeneity.py [--seeds 0 1 2 3 4] [--quick]``.

Every figure of part 1 is taken on each of ``--seeds`` (default 0-4; ``--seed N`` runs one) and the
headline is the WORST seed's (largest gap, largest idle ratio); ``by_seed`` lists them all.

1. ``--members`` (8) simulated members whose step times spread evenly from 1x to 4x a real step
   time of the real model (the CNN on the MNIST subset, batch 64, measured here as CPU time
   with torch on one thread: fl_node.heterogeneity.measure_step_times), transfers over a
   ``--bandwidth-mbit`` link (100 Mbit/s), ``--rounds`` (10) rounds, trained for real on IID
   shares (test accuracy on the 1,000 test images). The run is one job (fl_node.job.JobConfig,
   adaptive work with ``max_local_steps`` = 4 x ``--base-steps``): every member derives its plan,
   its training settings and its round's learning-rate cap from it as a node's trainer does, and
   trains through the node's local round (fl_node.local_round). The fixed arm aggregates by FedAvg
   (equal steps: the shares' weights); the adaptive arm as the node's aggregator does
   (fl_node.job.aggregation: normalized averaging, FedNova, each delta divided by its
   momentum-aware work norm a_i, averaged with the shares' data weights, the base steps' norm as
   the server step, a run past the base steps at a capped learning rate).
   Fixed work (``--base-steps`` = 7, one epoch of a share, for everyone) vs AIMD-adaptive work
   (fl_node.scheduler.AimdController against the training deadline = what the slowest member
   needs for the base work; at most 4x the base). Same seeds, same step-time draws.
   * ``idle_fraction_ratio``: the adaptive run's waiting time (members done before the last
     update is in) over the fixed run's, each as a fraction of all members' time. Goal <= 0.5.
   * ``acc_gap_equal_rounds``: fixed accuracy minus adaptive accuracy after the same rounds
     (positive: adaptive is worse). Goal <= 0.01. ``acc_gap_last3_mean`` is the same over the
     mean of the last three rounds. With the node's aggregation (the nominal work's server step,
     a round past the nominal steps at a capped learning rate) the adaptive arm makes the fixed
     arm's progress per round, not twice it as FedNova's sum p_i a_i did (the bench's default
     before issue 37, which gave gaps of -0.015 to -0.028). Its accuracy used to swing by 2-3 points
     in late rounds (gaps +0.024 on seeds 1 and 4): a member's share (450 images) is 7 batches
     of 64 and 2 images, and plain training stepped on that 2-image tail at the full learning
     rate whenever it ran past one epoch, which only the adaptive members did; a few of those
     steps made a member's update diverge (local accuracy 0.16, update norm 4x the others').
     fl_node.train now drops an epoch's short tail; the fixed arm (7 steps) is unchanged.
     Measured with the node's rule (``bench/heterogeneity.py``, seeds 0-4, shared 2-core machine,
     CPU-time steps): gaps -0.002, -0.004, -0.004, +0.003, -0.006 (fixed 0.915-0.938, adaptive
     0.921-0.942); seed 3 alone again: +0.019 (the steps the controllers choose follow the measured
     step times, and so the accuracy: the gap sits around 0 within about 0.02, at the goal's
     edge); idle_fraction_ratio 0.28-0.36 (0.67 on a seed whose step-time pool caught the
     neighbours' load: 3 of 12 steps at twice the others; 0.33 when measured again);
     makespan_ratio 0.357.
2. Three jobs on one node with ``--slots`` (1) CPU slot; each job's training task demands the
   whole device, so only one computes at a time (no free compute). Per round: download the
   global model, compute (``--job-epochs`` local epochs of the measured step time, 5/3/1 for
   the three jobs), upload the update, then ``--blocks-per-round`` (2: the update's inclusion
   and the scores that finalize the round) blocks of ``--block-time`` (2 s) on chain, during
   which the node holds nothing. Greedy placement with overlap (all jobs at once) vs the jobs
   one after another (a batch scheduler).
   * ``makespan_ratio``: overlap / sequential makespan. Goal <= 0.8. Because the ratio depends
     on how long a round waits on the chain, ``makespan_ratio_by_block_time`` gives it for
     block times from 0 (anvil's instant mining: only the swarm transfers overlap) to 12 s.

Figures were taken on a shared machine; the simulation's times come from measured CPU
seconds, so they do not depend on the neighbours' load, but the run's wall time does.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fl_node.codec import encode_update  # noqa: E402
from fl_node.heterogeneity import (  # noqa: E402
    JobWork,
    Link,
    Members,
    idle_ratio,
    job_rounds_from_pool,
    measure_step_times,
    run_federation,
    simulate_node_jobs,
)
from fl_node.job.config import DPConfig  # noqa: E402
from fl_node.job.simulated import job_for  # noqa: E402
from fl_node.job.training import train_config  # noqa: E402
from fl_node.partition import partition  # noqa: E402
from fl_node.scheduler import Device, TaskDemand, slots_for  # noqa: E402
from fl_node.simulate import prepared_model_and_data  # noqa: E402

GOALS = {"idle_fraction_ratio": 0.5, "acc_gap_equal_rounds": 0.01, "makespan_ratio": 0.8}
BLOCK_TIMES = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 12.0)
CORES = 2  # the simulated node's device; every job's training demands all of it
AIMD_BOUND = 4  # the job's max_local_steps in units of the base steps (its nominal work)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--base-steps", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--epsilon", type=float, help="DP-SGD target per member (default: no DP)")
    parser.add_argument("--bandwidth-mbit", type=float, default=100.0)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--job-rounds", type=int, default=10)
    parser.add_argument("--job-epochs", type=int, nargs=3, default=(5, 3, 1))
    parser.add_argument("--block-time", type=float, default=2.0)
    parser.add_argument("--blocks-per-round", type=int, default=2)
    parser.add_argument("--wall-clock", action="store_true", help="time steps by wall clock, not CPU time")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--seed", type=int, help="one seed only (instead of --seeds)")
    parser.add_argument("--quick", action="store_true", help="digits + mlp, 4 rounds (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.dataset, args.model, args.rounds, args.base_steps, args.batch_size = "digits", "mlp", 4, 5, 32
    if args.seed is not None:
        args.seeds = [args.seed]
    args.seed = args.seeds[0]  # the node part (3 jobs) runs on the first seed's step pool
    return args


def node_makespans(args, pool, steps_per_epoch, model_bytes, update_bytes, block_time):
    """Overlap and sequential makespans of the three jobs at one block time."""
    jobs = [
        JobWork(
            name=f"job{k}",
            compute_s=job_rounds_from_pool(
                pool, steps=epochs * steps_per_epoch, rounds=args.job_rounds, seed=args.seed + k
            ),
            download_bytes=model_bytes,
            upload_bytes=update_bytes,
            chain_s=args.blocks_per_round * block_time,
            # The whole device: a job's training uses every core, so two never compute at once.
            demand=TaskDemand("cpu", cores=CORES),
        )
        for k, epochs in enumerate(args.job_epochs)
    ]
    runs = {}
    for policy in ("overlap", "sequential"):
        slots = [
            slot for i in range(args.slots) for slot in slots_for(f"w{i}", [Device("cpu", "cpu", CORES)])
        ]
        runs[policy] = simulate_node_jobs(
            jobs, slots, bandwidth_bytes_per_s=args.bandwidth_mbit * 1e6 / 8, policy=policy
        )
    return runs


def federate(args: argparse.Namespace, seed: int) -> dict:
    """Part 1 on one seed: the fixed and the adaptive arm; their figures and the step pool."""
    splits, model = prepared_model_and_data(args.dataset, args.model, seed=seed)
    job = job_for(
        splits,
        args.model,
        rounds=args.rounds,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        dp=DPConfig(mode="sgd", target_epsilon=args.epsilon) if args.epsilon else DPConfig(mode="none"),
        adaptive_work=True,
        max_local_steps=AIMD_BOUND * args.base_steps,  # the nominal steps: the base work
        seed=seed,
    )
    share = splits.train.subset(partition(splits.train.y, args.members, "iid", seed=seed)[0])
    clock = time.perf_counter if args.wall_clock else time.process_time
    pool = measure_step_times(copy.deepcopy(model), share, train_config(job, seed=0), clock=clock)
    print(
        f"seed {seed}: step-time pool ({'wall' if args.wall_clock else 'CPU'} ms): {[round(p * 1e3, 2) for p in pool]}"
    )
    members = Members(args.members, link=Link(args.bandwidth_mbit * 1e6 / 8))
    runs = {}
    for mode in ("fixed", "adaptive"):

        def show(index, timing, mode=mode):
            print(f"  {mode:8} round {index + 1:2}: steps {list(timing.steps)} round {timing.round_s:.3f} s")

        runs[mode] = run_federation(job, members, mode, splits, copy.deepcopy(model), pool, on_round=show)
        print(f"{mode}: {json.dumps(runs[mode].summary())}")
    fixed, adaptive = runs["fixed"], runs["adaptive"]
    figures = {
        "seed": seed,
        "idle_fraction_ratio": round(idle_ratio(adaptive, fixed), 4),
        "acc_gap_equal_rounds": round(fixed.accuracy - adaptive.accuracy, 4),
        "idle_fraction_fixed": round(fixed.idle_fraction, 4),
        "idle_fraction_adaptive": round(adaptive.idle_fraction, 4),
        "acc_gap_last3_mean": round(sum(fixed.accuracies[-3:]) / 3 - sum(adaptive.accuracies[-3:]) / 3, 4),
        "acc_fixed": fixed.accuracy,
        "acc_adaptive": adaptive.accuracy,
        "steps_fixed": fixed.total_steps,
        "steps_adaptive": adaptive.total_steps,
        "sim_wall_s_fixed": round(fixed.wall_s, 3),
        "sim_wall_s_adaptive": round(adaptive.wall_s, 3),
        "epsilons_adaptive": [round(e, 3) for e in adaptive.epsilons] if adaptive.epsilons else None,
        "epsilons_fixed": [round(e, 3) for e in fixed.epsilons] if fixed.epsilons else None,
        "step_ms_median": round(sorted(pool)[len(pool) // 2] * 1e3, 3),
    }
    return {"figures": figures, "pool": pool, "model": model, "share": share}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)  # one thread: CPU time per step is then the step's cost
    started = time.perf_counter()
    print("aggregation: fixed arm FedAvg; adaptive arm the node's (fl_node.job.aggregation: FedNova)")
    seeds = [federate(args, seed) for seed in args.seeds]
    by_seed = [run["figures"] for run in seeds]
    worst_gap = max(by_seed, key=lambda f: f["acc_gap_equal_rounds"])
    worst_idle = max(by_seed, key=lambda f: f["idle_fraction_ratio"])
    pool, model, share = seeds[0]["pool"], seeds[0]["model"], seeds[0]["share"]

    state = model.state_dict()
    model_bytes = len(encode_update({k: v.float() for k, v in state.items()}))
    steps_per_epoch = -(-len(share) // args.batch_size)
    sweep = {}
    for block_time in sorted({*BLOCK_TIMES, args.block_time}):
        node = node_makespans(args, pool, steps_per_epoch, model_bytes, model_bytes, block_time)
        sweep[block_time] = node
        print(
            f"3 jobs, block time {block_time:5.2f} s: overlap {node['overlap'].makespan_s:8.2f} s, "
            f"sequential {node['sequential'].makespan_s:8.2f} s, "
            f"ratio {node['overlap'].makespan_s / node['sequential'].makespan_s:.3f}"
        )
    headline = sweep[args.block_time]
    figures = {
        # The worst seed's: the largest gap and the largest idle ratio of --seeds.
        "idle_fraction_ratio": worst_idle["idle_fraction_ratio"],
        "acc_gap_equal_rounds": worst_gap["acc_gap_equal_rounds"],
        "makespan_ratio": round(headline["overlap"].makespan_s / headline["sequential"].makespan_s, 4),
        "worst_seed_acc_gap": worst_gap["seed"],
        "worst_seed_idle": worst_idle["seed"],
        "acc_gap_by_seed": {str(f["seed"]): f["acc_gap_equal_rounds"] for f in by_seed},
        "by_seed": by_seed,
        "makespan_overlap_s": round(headline["overlap"].makespan_s, 3),
        "makespan_sequential_s": round(headline["sequential"].makespan_s, 3),
        "slot_utilisation_overlap": headline["overlap"].summary()["slot_utilisation"],
        "makespan_ratio_by_block_time": {
            str(bt): round(n["overlap"].makespan_s / n["sequential"].makespan_s, 4) for bt, n in sweep.items()
        },
        "step_clock": "wall" if args.wall_clock else "cpu",
        "model_bytes": model_bytes,
        "settings": {
            "dataset": args.dataset,
            "model": args.model,
            "members": args.members,
            "rounds": args.rounds,
            "base_steps": args.base_steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "momentum": args.momentum,
            "epsilon": args.epsilon,
            "seeds": args.seeds,
            "aggregation": {"fixed": "fedavg", "adaptive": "fednova (the node's: base server step, lr cap)"},
            "bandwidth_mbit": args.bandwidth_mbit,
            "slots": args.slots,
            "job_epochs": list(args.job_epochs),
            "job_rounds": args.job_rounds,
            "block_time": args.block_time,
            "blocks_per_round": args.blocks_per_round,
        },
        "goals": GOALS,
        "bench_wall_s": round(time.perf_counter() - started, 1),
    }
    for name, goal in GOALS.items():
        print(f"{name}: {figures[name]} (goal <= {goal}: {'met' if figures[name] <= goal else 'NOT met'})")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
