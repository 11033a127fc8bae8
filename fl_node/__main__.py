"""Command line of the learning engine: ``python -m fl_node simulate ...``.

Bad arguments end with exit code 2 and one sentence on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# DP-SGD clips every per-example gradient to --max-grad-norm (0.1), which bounds a step to
# lr * 0.1: a large lr suits it (De et al. 2022). Unclipped SGD at that lr would diverge.
DP_LR = 2.0
PLAIN_LR = 0.05


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fl_node", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser("simulate", help="run an in-process federation with the committee protocol")
    sim.add_argument("--dataset", default="mnist", help="digits, mnist or zipf_text")
    sim.add_argument(
        "--model",
        default="scatternet",
        help="registered model name or dotted path (default scatternet: fixed scattering features + linear)",
    )
    sim.add_argument("--nodes", type=int, default=5)
    sim.add_argument("--partition", default="dirichlet:0.5", help="iid, dirichlet:ALPHA or shards:K")
    sim.add_argument("--rounds", type=int, default=20)
    sim.add_argument("--epsilon", type=float, default=None, help="target epsilon per dataset; omit for no DP")
    sim.add_argument("--delta", type=float, default=1e-5)
    sim.add_argument("--dp-mode", default="sgd", choices=["sgd", "update"])
    sim.add_argument("--committee", type=int, default=2)
    sim.add_argument("--top-k", type=int, default=None, help="default: the job's (3)")
    sim.add_argument("--strategy", default="fedavg")
    sim.add_argument(
        "--attack", default=None, help="label_flip, sign_flip, gaussian or free_rider, as NAME:FRACTION"
    )
    sim.add_argument("--local-epochs", type=int, default=1)
    # Defaults from bench/accuracy_at_epsilon.py (90% test accuracy at epsilon 3 on the MNIST subset).
    sim.add_argument("--batch-size", type=int, default=128)
    sim.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"default {DP_LR} with --epsilon (clipped steps), else {PLAIN_LR}",
    )
    sim.add_argument("--momentum", type=float, default=0.5)
    sim.add_argument("--max-grad-norm", type=float, default=0.1)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--out", type=Path, default=Path("out/simulation"), help="folder for result.json and plot.png"
    )
    return parser


def _simulate(args: argparse.Namespace, console: Console) -> int:
    from fl_node.job.config import DPConfig
    from fl_node.plot import plot_rounds
    from fl_node.simulate import run_simulation, simulation

    dp = (
        DPConfig(
            mode=args.dp_mode, target_epsilon=args.epsilon, delta=args.delta, max_grad_norm=args.max_grad_norm
        )
        if args.epsilon is not None
        else DPConfig(mode="none")
    )
    job = {"top_k": args.top_k} if args.top_k is not None else {}
    config = simulation(
        args.dataset,
        model=args.model,
        nodes=args.nodes,
        partition=args.partition,
        attack=args.attack,
        # The job every simulated node runs (fl_node.job.config.JobConfig's fields).
        rounds=args.rounds,
        dp=dp,
        committee_size=args.committee,
        strategy=args.strategy,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        lr=args.lr if args.lr is not None else (DP_LR if args.epsilon is not None else PLAIN_LR),
        momentum=args.momentum,
        seed=args.seed,
        **job,
    )
    columns = (
        TextColumn("[bold]round"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
    )
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("rounds", total=config.job.rounds, status="training")

        def on_round(record) -> None:
            rejected = sum(not u.accepted for u in record.updates)
            progress.update(
                task,
                advance=1,
                status=f"acc {record.test_accuracy:.3f}  eps {record.epsilon_rdp:.2f}  rejected {rejected}",
            )

        result = run_simulation(config, on_round=on_round)
    summary = result.to_dict()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(summary, indent=2))
    plot = plot_rounds(summary, args.out / "plot.png")
    console.print(
        f"final accuracy {summary['final_accuracy']:.4f}, epsilon (RDP) {summary['final_epsilon_rdp']:.3f}"
    )
    console.print(
        f"attacker rejected in {summary['attack_rejected_rounds']}/{summary['attack_rounds']} rounds"
    )
    console.print(f"wrote {args.out / 'result.json'} and {plot}")
    brief = {k: summary[k] for k in ("final_accuracy", "final_epsilon_rdp", "final_epsilon_prv")}
    print(json.dumps(brief | {"attack_rejected_rounds": summary["attack_rejected_rounds"]}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        return _simulate(args, console)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
