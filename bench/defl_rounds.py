"""One DeFL job on a local federation (anvil + N node processes), timed round by round.

Shared by bench/round_overhead.py and bench/vs_flower.py. The nodes are what ``make demo``
starts (devnet.localnet.LocalFederation): real processes on loopback, each with its own
SQLite database, chunk directory and key, driven through the REST API.

A round's wall time runs from the end of the previous round (the action that fixed its
global model; for round 1, the ``start`` call) to the end of the action that fixed this
round's model. It is split along the round's critical path, read from every node's rounds
API ``timings``: the last trainer to finish, the last committee member to score (whose
``submitScores`` also finalizes the round on chain), a separate finalize action where one went
through (only when a score deadline passed), the aggregator that fixed the model. Each of those actions
reports its parts (backend/jobs/driver/timing.py); what lies between them is waiting.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devnet.localnet import LocalFederation, NodeSpec
from fl_node.data import load_dataset
from fl_node.partition import partition

# "prepare": loading config, data split and global model; "privacy": DP calibration and budget charge
# (with its spendPrivacy transaction); "other_in_actions": the rest of the actions' time (database,
# encoding); "waiting": between the actions (agent ticks, indexing, other nodes noticing).
PARTS = ("train", "swarm", "chain", "score", "aggregate", "privacy", "prepare", "other_in_actions", "waiting")
# Time of the critical path's actions that ran before the round's window opened: trainers start a
# round as soon as the previous one is finalized (speculative training), while its model is still
# being fixed, so their preparation overlaps the previous round's end. Reported beside the parts.
OVERLAP = "overlap"


@dataclass
class JobSettings:
    nodes: int = 4
    model: str = "cnn"
    rounds: int = 5
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.5
    dp: str = "sgd"  # "sgd" (DP-SGD at epsilon) or "none"
    epsilon: float = 3.0
    committee: int = 1
    partition: str = "iid"
    seed: int = 0
    agent_interval: float | None = None  # None: the nodes' default (backend.settings)
    chain: str = "anvil"  # or "consortium": a Clique validator per node (devnet/localnet.py)
    block_time: float | None = None  # seconds between blocks; None: anvil mines at once (consortium: 2)

    @property
    def trainers(self) -> int:
        return self.nodes - self.committee

    def dp_payload(self) -> dict:
        if self.dp == "none":
            return {"mode": "none"}
        return {"mode": "sgd", "target_epsilon": self.epsilon, "delta": 1e-5, "max_grad_norm": 1.0}


@dataclass
class RoundSplit:
    round: int
    wall: float
    parts: dict[str, float] = field(default_factory=dict)


@dataclass
class JobRun:
    settings: JobSettings
    rounds: list[RoundSplit]
    final_model: bytes
    startup_s: float
    # Every node's rounds API as returned (per action: started, finished, parts), for --raw.
    raw: dict[str, object] = field(default_factory=dict)

    def totals(self) -> dict[str, float]:
        out = {p: sum(r.parts.get(p, 0.0) for r in self.rounds) for p in (*PARTS, OVERLAP)}
        out["round"] = sum(r.wall for r in self.rounds)
        return out


def partitions(settings: JobSettings):
    """The MNIST subset split over the nodes (the same split Flower's clients get)."""
    splits = load_dataset("mnist", seed=settings.seed)
    parts = partition(splits.train.y, settings.nodes, settings.partition, seed=settings.seed)
    return splits, [splits.train.subset(p) for p in parts]


def job_payload(settings: JobSettings, dataset_id: int) -> dict:
    return {
        "name": "bench",
        "model": settings.model,
        "dataset": dataset_id,
        "rounds": settings.rounds,
        "local_epochs": settings.local_epochs,
        "batch_size": settings.batch_size,
        "lr": settings.lr,
        "strategy": "fedavg",
        "dp": settings.dp_payload(),
        "committee_size": settings.committee,
        "top_k": settings.trainers,
        "min_trainers": settings.trainers,
        "round_timeout_s": 300,
    }


def run_job(settings: JobSettings, *, log=print, root: Path | None = None) -> JobRun:
    started = time.monotonic()
    specs = [NodeSpec(name=f"org-{chr(ord('a') + i)}") for i in range(settings.nodes)]
    with tempfile.TemporaryDirectory(prefix="defl-bench-") as scratch:
        federation = LocalFederation(
            root or Path(scratch),
            specs,
            log=log,
            agent_interval=settings.agent_interval,
            chain=settings.chain,
            block_time=settings.block_time,
            # the development flag only where the production rule (odd, at least 3) refuses the job
            allow_small_committees=settings.committee < 3 or settings.committee % 2 == 0,
        )
        with federation:
            splits, parts = partitions(settings)
            datasets = [
                federation.upload_dataset(
                    node,
                    part.x,
                    part.y,
                    name=f"{node.spec.name}-mnist",
                    classes=list(range(splits.num_classes)),
                    epsilon_cap=100.0,  # the most the chain accepts; the job targets epsilon 3
                )["id"]
                for node, part in zip(federation.nodes, parts, strict=True)
            ]
            job = federation.create_job(federation.nodes[0], job_payload(settings, datasets[0]))
            for node, dataset in zip(federation.nodes, datasets, strict=True):
                federation.join(node, job["id"], dataset)
            # As an operator would: start once every node has its first round ready.
            if not federation.wait_prepared(job["id"]):
                log("not every node prepared the first round in time; starting anyway")
            startup = time.monotonic() - started
            log(f"federation up and job {job['id']} joined in {startup:.1f}s; starting it")
            t0 = time.time()
            federation.start_job(federation.nodes[0], job["id"])
            final = federation.wait_for_job(job["id"], timeout_s=1800)
            if final["status"] != "finished":
                raise RuntimeError(f"job ended {final['status']}")
            timings = {node.address: federation.rounds(node, job["id"]) for node in federation.nodes}
            model = final_model(federation, job["id"])
    return JobRun(settings, split_rounds(timings, t0), model, startup, {"t0": t0, **timings})


def final_model(federation: LocalFederation, job_id: int) -> bytes:
    node = federation.nodes[0]
    response = node.api().get(f"{node.url}/api/models", params={"page_size": 100}, timeout=30)
    response.raise_for_status()
    body = response.json()
    items = body["results"] if isinstance(body, dict) else body
    last = max((m for m in items if int(m["job"]) == int(job_id)), key=lambda m: m["round"])
    download = node.api().get(f"{node.url}/api/models/{last['id']}/download", timeout=60)
    download.raise_for_status()
    return download.content


def split_rounds(rounds_by_node: dict[str, list[dict]], t0: float) -> list[RoundSplit]:
    numbers = sorted({r["round"] for rounds in rounds_by_node.values() for r in rounds})
    out, start = [], t0
    for number in numbers:
        actions: dict[str, list[dict]] = {}
        for rounds in rounds_by_node.values():
            for r in rounds:
                if r["round"] == number:
                    for kind, timing in (r.get("timings") or {}).items():
                        if timing.get("finished") is not None:
                            actions.setdefault(kind, []).append(timing)
        if "aggregate" not in actions:
            continue
        end = max(a["finished"] for a in actions["aggregate"])
        path = [
            max(actions.get(kind, []), key=lambda a: a["finished"], default=None)
            for kind in ("train", "score", "aggregate")
        ]
        # Every node may try to finalize; the one that went through sent the transaction.
        path.append(
            max(actions.get("finalize", []), key=lambda a: a["parts"].get("chain_tx", 0.0), default=None)
        )
        split = {p: 0.0 for p in PARTS}
        for action in filter(None, path):
            parts = action.get("parts") or {}
            split["train"] += parts.get("train", 0.0)
            split["swarm"] += parts.get("swarm", 0.0)
            split["chain"] += parts.get("chain_tx", 0.0) + parts.get("chain_read", 0.0)
            split["score"] += parts.get("score", 0.0)
            split["aggregate"] += parts.get("aggregate", 0.0)
            split["privacy"] += parts.get("privacy", 0.0)
            split["prepare"] += parts.get("prepare", 0.0)
            split["other_in_actions"] += max(0.0, action["seconds"] - sum(parts.values()))
        wall = end - start
        busy = sum(split.values())
        split["waiting"] = max(0.0, wall - busy)
        split[OVERLAP] = max(0.0, busy - wall)
        out.append(RoundSplit(number, wall, split))
        start = end
    return out


def test_accuracy(model_bytes: bytes, settings: JobSettings) -> float:
    """Accuracy of an encoded global model on the MNIST subset's test split."""
    import torch

    from fl_node.codec import decode_model
    from fl_node.models import create_model
    from fl_node.train import evaluate

    splits = load_dataset("mnist", seed=settings.seed)
    net = create_model(settings.model, **splits.model_kwargs())
    state, _ = decode_model(model_bytes)
    net.load_state_dict({k: v.to(torch.float32) if v.is_floating_point() else v for k, v in state.items()})
    return float(evaluate(net, *splits.test.tensors())["accuracy"])


def as_seconds(values: dict[str, float]) -> dict[str, float]:
    return {f"{k}_s": round(float(v), 3) for k, v in values.items()}


def median(values) -> float:
    return float(np.median(list(values))) if values else float("nan")
