"""``make demo``: a local federation of three organizations training one model with DP.

Starts a chain (an anvil, or with ``--chain consortium`` one Clique validator per organization,
each node talking to its own), deploys the contracts, starts three node processes (each with its own
SQLite database, chunk directory and key), uploads three data providers' partitions of the
MNIST subset (encrypted before they leave each node), creates a job through the REST API
(DP-SGD at epsilon 3, committee of 1), follows it round by round, then prints the dashboard
URLs and keeps the nodes up until Ctrl-C (``--exit-when-done`` for scripts).

Three nodes cannot seat the production minimum committee of 3 and still have trainers, so the demo
deploys its contracts with the development flag ``allowSmallCommittees`` and says so; with
``--committee`` odd and at least 3 (and more nodes) it deploys a production-rule contract instead.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from rich.console import Console
from rich.table import Table

from devnet.localnet import OPERATOR, LocalFederation, NodeSpec


def _partitions(nodes: int, partition_spec: str, seed: int):
    from fl_node.data import load_dataset
    from fl_node.partition import partition

    splits = load_dataset("mnist", seed=seed)
    parts = partition(splits.train.y, nodes, partition_spec, seed=seed)
    return splits, [splits.train.subset(p) for p in parts]


def _job_payload(args: argparse.Namespace, dataset_id: int) -> dict:
    return {
        "name": "mnist-dp-demo",
        "model": args.model,
        "dataset": dataset_id,
        "rounds": args.rounds,
        "local_epochs": 1,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": args.epsilon, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": args.committee,
        "top_k": args.nodes - args.committee,
        "min_trainers": args.nodes - args.committee,
        "round_timeout_s": 300,
    }


class RoundPrinter:
    """Prints each round's phase changes and results once, as they happen."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.seen: dict[int, tuple] = {}

    def __call__(self, job: dict, rounds: list[dict]) -> None:
        for r in rounds:
            metrics = r.get("metrics") or {}
            txs = len(r.get("transactions") or [])
            state = (r["phase"], metrics.get("accuracy"), txs)
            if self.seen.get(r["round"]) == state:
                continue
            self.seen[r["round"]] = state
            accepted = sum(1 for u in r.get("updates", []) if u.get("accepted"))
            line = f"round {r['round']}/{job['rounds']}: {r['phase']:<11} updates {len(r.get('updates', []))}"
            line += f" accepted {accepted}  transactions {txs}"
            if metrics:
                line += f"  accuracy {metrics['accuracy']:.3f}"
            line += _epsilon_text(job)
            self.console.print(line)


def _epsilon_text(job: dict) -> str:
    """The job's epsilon as the API states it: the largest any participant spent, reserved apart."""
    privacy = job.get("privacy") or {}
    if privacy.get("epsilon_max") is None:
        return ""
    participants = privacy.get("participants") or []
    reserved = max((p.get("epsilon_reserved") or 0.0 for p in participants), default=0.0)
    text = (
        f"  epsilon (max over participants, delta {privacy.get('delta', 0):g}) {privacy['epsilon_max']:.2f}"
    )
    if reserved > 0:
        text += f" (+{reserved:.2f} reserved)"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devnet.demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--committee", type=int, default=1)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--partition", default="iid")
    parser.add_argument(
        "--chain",
        choices=("anvil", "consortium"),
        default="anvil",
        help="anvil: one local development chain; consortium: one Clique validator per organization "
        "(the EthereumJS client), each node talking to its own",
    )
    parser.add_argument(
        "--block-time",
        type=float,
        default=None,
        help="seconds between blocks (anvil: at once; consortium: 2)",
    )
    parser.add_argument("--root", type=Path, default=Path("var/demo"))
    parser.add_argument("--exit-when-done", action="store_true", help="stop the nodes when the job ends")
    args = parser.parse_args(argv)
    console = Console()
    if not 1 <= args.committee < args.nodes:
        console.print("error: --committee must be at least 1 and smaller than --nodes")
        return 2
    if args.root.exists():
        import shutil

        shutil.rmtree(args.root)  # a demo starts from a clean chain and clean nodes
    specs = [NodeSpec(name=f"org-{chr(ord('a') + i)}") for i in range(args.nodes)]
    small = args.committee < 3 or args.committee % 2 == 0
    if small:
        console.print(
            f"note: a committee of {args.committee} is below the production rule (odd, at least 3): "
            "the contracts are deployed with the DEVELOPMENT flag allowSmallCommittees"
        )
    if args.block_time is not None and not (0 <= args.block_time <= 60):
        console.print("error: --block-time must be between 0 and 60 seconds")
        return 2
    if args.chain == "consortium" and args.block_time is not None and args.block_time < 1:
        console.print("error: a consortium's Clique block time is at least 1 second")
        return 2
    federation = LocalFederation(
        args.root,
        specs,
        log=console.print,
        allow_small_committees=small,
        chain=args.chain,
        block_time=args.block_time or None,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with federation:
            splits, parts = _partitions(args.nodes, args.partition, seed=0)
            classes = list(range(splits.num_classes))
            datasets = []
            for node, part in zip(federation.nodes, parts, strict=True):
                record = federation.upload_dataset(
                    node, part.x, part.y, name=f"{node.spec.name}-mnist", classes=classes, epsilon_cap=10.0
                )
                datasets.append(record["id"])
                console.print(
                    f"{node.spec.name}: uploaded {len(part)} images, encrypted, on chain as "
                    f"dataset {record.get('onchain_id')}"
                )
            job = federation.create_job(federation.nodes[0], _job_payload(args, datasets[0]))
            job_id = job["id"]
            console.print(f"job {job_id} proposed on chain (tx {job.get('tx_hash')})")
            for node, dataset in zip(federation.nodes, datasets, strict=True):
                federation.join(node, job_id, dataset)
            if not federation.wait_prepared(job_id):
                console.print("not every node prepared the first round in time; starting anyway")
            federation.start_job(federation.nodes[0], job_id)
            console.print("job started: each node reveals the draw secret it committed to when it joined")
            drawn = federation.wait_drawn(job_id)
            console.print(
                "first committee drawn on chain from the revealed secrets: "
                + (", ".join(a[:10] for a in drawn["committee"]) or f"none (the job {drawn['status']})")
            )
            final = federation.wait_for_job(job_id, on_progress=RoundPrinter(console))
            _summary(console, federation, job_id, final)
            if not args.exit_when_done:
                console.print("nodes stay up; Ctrl-C stops them")
                try:
                    while not stop.wait(1):
                        pass
                except KeyboardInterrupt:
                    pass
            return 0 if final["status"] == "finished" else 1
    except KeyboardInterrupt:
        return 130


def _summary(console: Console, federation: LocalFederation, job_id: int, job: dict) -> None:
    rounds = federation.rounds(federation.nodes[0], job_id)
    table = Table(title=f"job {job_id}: {job['status']}")
    for column in ("round", "committee", "accepted", "accuracy", "epsilon of node A", "global model hash"):
        table.add_column(column)
    for r in rounds:
        metrics = r.get("metrics") or {}
        table.add_row(
            str(r["round"]),
            ", ".join(a[:8] for a in r["committee"]),
            f"{sum(1 for u in r['updates'] if u.get('accepted'))}/{len(r['updates'])}",
            f"{metrics.get('accuracy', float('nan')):.3f}",
            f"{metrics.get('epsilon', float('nan')):.2f}",
            ((r.get("global_model") or {}).get("hash") or "")[:18],
        )
    console.print(table)
    console.print(
        f"dashboards (login: user [bold]{OPERATOR}[/bold], password [bold]{federation.password}[/bold]):"
    )
    for node in federation.nodes:
        console.print(f"  {node.spec.name}: {node.url}/")
    last = rounds[-1].get("metrics") or {}
    privacy = job.get("privacy") or {}
    console.print(f"privacy:{_epsilon_text(job) or ' (not reported)'}")
    print(
        json.dumps(
            {
                "job": job_id,
                "status": job["status"],
                "final_accuracy": last.get("accuracy"),
                "epsilon_max": privacy.get("epsilon_max"),
                "epsilon_final": privacy.get("final"),
                "delta": privacy.get("delta"),
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
