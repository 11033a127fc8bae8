"""DeFL's local federation against Flower's simulation: time per round and final accuracy.

Run from the repository root: ``.venv/bin/python bench/vs_flower.py [--rounds N] [--dp none] [--repeat N]``.

Workload: 5 local epochs per round by default on both sides (FedAvg's usual E=5, McMahan et
al. 2017): the goal is about the platform's cost relative to real local training, and a
1-epoch round on 720 samples trains for about a second. The 1-epoch workload is measured
too, on both sides (``--secondary-epochs``), and reported as ``round_time_vs_flower_1_epoch``.

Both sides train the CNN on the same iid partitions of the MNIST subset (4 organizations),
the same rounds and local epochs, with the same training code (``fl_node.train.train_local``
with the TrainConfig the DeFL job derives: DP-SGD at epsilon 3 on both sides, or no DP on
both with ``--dp none``), three trainers a round, FedAvg weighted by samples, the same
initial weights. The final global model of each is measured on the same test split.

- DeFL: four node processes on an anvil chain (bench/defl_rounds.py, as ``make demo``). Per
  round it also runs what Flower has no counterpart for: the committee (one node) fetches
  and scores every update on its validation data and submits the scores; a finalize
  transaction; the new committee aggregates, stores the model in the swarm store and
  proposes it on chain; every node fetches the fixed model, serves it and evaluates it;
  updates and models travel through the swarm store, every step is a chain transaction.
- Flower: ``flwr.simulation.start_simulation`` (Ray virtual clients, one process per
  concurrently training client, server in this process; bench/flower_side.py), FedAvg.
  Flower's round: sample three clients, send the weights, train, send weights back,
  aggregate. No DP server-side, no scoring, no persistence.

A round's time: DeFL, from the end of the previous round to the action that fixed this
round's model (round 1 from the start call); Flower, from configure_fit to the end of
aggregate_fit. Neither side counts its start-up (processes, chain, Ray); DeFL's job is started once
every node reports its first round prepared (data loaded, noise calibrated), as Flower's clients
have their data before the first round. The sides run one
after the other, alternating ``--repeat`` times (5 by default: on a shared machine one pair of
runs alone gave ratios from 1.01 to 1.40); the ratio uses the medians of the per-round
times. Goal: DeFL per round <= 1.2x Flower. Last line: one JSON object (``workload`` names the
default one; ``secondary`` holds the 1-epoch figures).

Flower is not a DeFL dependency: it is installed on demand into var/flower-site
(``pip install --target var/flower-site flwr==1.42.0 ray==2.55.1``; ``--no-install`` only
prints that command), not into .venv, where it would replace the pinned rich and packaging.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import flower_side  # noqa: E402
from bench.defl_rounds import JobSettings, run_job, test_accuracy  # noqa: E402

GOAL = 1.2


def ensure_flower(install: bool) -> None:
    have = (flower_side.FLOWER_SITE / "flwr").is_dir() and (flower_side.FLOWER_SITE / "ray").is_dir()
    if have or importlib.util.find_spec("flwr") and importlib.util.find_spec("ray"):
        return
    command = flower_side.install_command()
    if not install:
        sys.exit("Flower is not installed; run: " + " ".join(command))
    print("installing Flower for this benchmark: " + " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True)


def run_flower(settings: JobSettings) -> dict:
    argv = [sys.executable, str(Path(flower_side.__file__)), json.dumps(asdict(settings))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError("the Flower side failed:\n" + done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=5, help="the workload (FedAvg's E=5)")
    parser.add_argument(
        "--secondary-epochs", type=int, default=1, help="also measure this many epochs (0: skip)"
    )
    parser.add_argument("--dp", choices=("sgd", "none"), default="sgd")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="run each side this many times, alternating (a shared machine drifts: single runs swing by 30%%)",
    )
    parser.add_argument("--no-install", action="store_true", help="do not install Flower; print the command")
    args = parser.parse_args(argv)
    ensure_flower(not args.no_install)
    settings = JobSettings(rounds=args.rounds, local_epochs=args.local_epochs, dp=args.dp)
    ratio, result = compare(settings, args.repeat)
    result = {
        "round_time_vs_flower": round(ratio, 3),
        "goal": GOAL,
        "met": ratio <= GOAL,
        "workload": f"{settings.local_epochs} local epochs a round on both sides"
        + (" (FedAvg E=5, McMahan et al. 2017)" if settings.local_epochs == 5 else ""),
        **result,
    }
    if args.secondary_epochs and args.secondary_epochs != settings.local_epochs:
        secondary = replace(settings, local_epochs=args.secondary_epochs)
        ratio_2, result_2 = compare(secondary, args.repeat)
        suffix = f"_{secondary.local_epochs}_epoch"
        result["round_time_vs_flower" + suffix] = round(ratio_2, 3)
        result["met" + suffix] = ratio_2 <= GOAL
        result["secondary"] = result_2
    print(json.dumps(result))
    return 0


def compare(settings: JobSettings, repeat: int) -> tuple[float, dict]:
    """Both sides with ``settings``, alternating ``repeat`` times; the ratio of median round times."""
    defl_rounds, flower_rounds, defl_acc, flower_acc = [], [], [], []
    for i in range(repeat):
        flower = run_flower(settings)
        flower_rounds.append(flower["round_s"])
        flower_acc.append(flower["accuracy"])
        print(
            f"run {i + 1}: Flower {flower['flower_version']} rounds {_fmt(flower['round_s'])}",
            file=sys.stderr,
        )
        defl = run_job(settings, log=lambda line: print(line, file=sys.stderr))
        defl_rounds.append([r.wall for r in defl.rounds])
        defl_acc.append(test_accuracy(defl.final_model, settings))
        print(f"run {i + 1}: DeFL rounds {_fmt(defl_rounds[-1])}", file=sys.stderr)
    defl_median = statistics.median(t for run in defl_rounds for t in run)
    flower_median = statistics.median(t for run in flower_rounds for t in run)
    ratio = defl_median / flower_median
    print(
        f"{settings.local_epochs} local epochs, per round: DeFL {defl_median:.2f}s, "
        f"Flower {flower_median:.2f}s, ratio {ratio:.2f} (goal <= {GOAL})"
    )
    print(f"final test accuracy: DeFL {_fmt(defl_acc, 3)}, Flower {_fmt(flower_acc, 3)}")
    return ratio, {
        "defl_acc": round(statistics.median(defl_acc), 4),
        "flower_acc": round(statistics.median(flower_acc), 4),
        "defl_round_s": round(defl_median, 3),
        "flower_round_s": round(flower_median, 3),
        "defl_round_s_per_run": [[round(t, 3) for t in run] for run in defl_rounds],
        "flower_round_s_per_run": [[round(t, 3) for t in run] for run in flower_rounds],
        "defl_acc_per_run": defl_acc,
        "flower_acc_per_run": flower_acc,
        "flower_version": flower["flower_version"],
        "settings": asdict(settings),
    }


def _fmt(values, digits: int = 2) -> str:
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
