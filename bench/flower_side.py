"""The Flower side of bench/vs_flower.py, run in its own process (Flower is not a DeFL dependency).

``python bench/flower_side.py '<settings json>'`` runs Flower's Ray-based simulation
(``flwr.simulation.start_simulation``, FedAvg) with one virtual client per DeFL node and
prints one JSON line: seconds per round and the final model's test accuracy.

The clients do exactly what a DeFL trainer does: ``fl_node.train.train_local`` with the
``TrainConfig`` the DeFL job's configuration derives (same model, initial weights, batch
size, learning rate, momentum, local epochs, DP-SGD noise and clipping, per-round seeds), on
the same partition of the MNIST subset less the same 20% validation share. Each round
samples as many clients as DeFL has trainers (the nodes less the committee), all of them
at once (one Ray CPU each, one torch thread each, as DeFL's node processes have).

Flower and its dependencies live in var/flower-site (``pip install --target``), appended to
sys.path, so the project's own pinned packages (rich, packaging, numpy) win wherever both
have one and the project's .venv stays as requirements.txt describes.
"""

from __future__ import annotations

import json
import os
import site
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOWER_SITE = ROOT / "var" / "flower-site"
FLOWER_REQUIREMENTS = ("flwr==1.42.0", "ray==2.55.1")
sys.path.insert(0, str(ROOT))
sys.path.append(str(FLOWER_SITE))
# Ray's own processes (raylet agents, client workers) get the same order: the project, .venv, Flower.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *site.getsitepackages(), str(FLOWER_SITE)])
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def install_command() -> list[str]:
    return [sys.executable, "-m", "pip", "install", "-q", "--target", str(FLOWER_SITE), *FLOWER_REQUIREMENTS]


def job_config(settings: dict):
    from fl_node.job.config import DPConfig, JobConfig

    dp = (
        {"mode": "none"}
        if settings["dp"] == "none"
        else {
            "mode": "sgd",
            "target_epsilon": settings["epsilon"],
            "delta": 1e-5,
            "max_grad_norm": 1.0,
        }
    )
    trainers = settings["nodes"] - settings["committee"]
    # What backend.jobs_api.services builds from the benchmark's create request (bench/defl_rounds.py).
    return JobConfig(
        name="bench",
        model=settings["model"],
        input_shape=(1, 28, 28),
        num_classes=10,
        schema_hash="",
        rounds=settings["rounds"],
        local_epochs=settings["local_epochs"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        dp=DPConfig(**dp),
        committee_size=settings["committee"],
        top_k=trainers,
        min_trainers=trainers,
    )


def main(settings: dict) -> dict:
    import flwr
    import numpy as np
    import torch
    from flwr.client import NumPyClient
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import start_simulation

    from fl_node.data import load_dataset, stratified_split
    from fl_node.job import training
    from fl_node.job.plan import participant_plan, scores_per_round
    from fl_node.models import create_model
    from fl_node.partition import partition
    from fl_node.train import evaluate, train_local

    config = job_config(settings)
    splits = load_dataset("mnist", seed=settings["seed"])
    parts = partition(splits.train.y, settings["nodes"], settings["partition"], seed=settings["seed"])
    train_parts = []
    record_counts = [len(p) for p in parts]
    trainers = settings["nodes"] - settings["committee"]
    for i, p in enumerate(parts):
        data = splits.train.subset(p)
        train_idx, _ = stratified_split(data.y, (1 - config.val_fraction, config.val_fraction), seed=i)
        train_parts.append(data.subset(np.sort(train_idx)))
    initial = training.build_model(config)
    keys = list(initial.state_dict())

    def to_state(arrays) -> dict:
        return {k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)}

    def to_arrays(state) -> list:
        return [state[k].detach().cpu().numpy() for k in keys]

    class Trainer(NumPyClient):
        def __init__(self, index: int) -> None:
            self.index = index

        def fit(self, parameters, fit_config):
            torch.set_num_threads(1)
            round_ = int(fit_config["round"])
            seed = training.round_seed(config, round_, self.index)  # DeFL's trainer's seed
            model = training.build_model(config)
            data = train_parts[self.index]
            # The same plan as a DeFL node's (its noise, its secret randomness by default).
            plan = participant_plan(
                config,
                samples=record_counts[self.index],
                public_holdout=False,
                scores_per_round=scores_per_round(settings["nodes"], settings["committee"]),
            )
            train_local(model, to_state(parameters), data, training.train_config(config, seed, plan))
            return to_arrays(model.state_dict()), len(train_parts[self.index]), {}

    def client_fn(context):
        return Trainer(int(context.node_config["partition-id"])).to_client()

    times: dict[int, list[float]] = {}

    class TimedFedAvg(FedAvg):
        """FedAvg that notes when each round's fit starts and when its aggregate is done."""

        def configure_fit(self, server_round, parameters, client_manager):
            times[server_round] = [time.perf_counter()]
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            times[server_round].append(time.perf_counter())
            final[0] = out[0]
            return out

    trainers = settings["nodes"] - settings["committee"]
    final = [None]
    strategy = TimedFedAvg(
        fraction_fit=trainers / settings["nodes"],
        min_fit_clients=trainers,
        fraction_evaluate=0.0,
        min_evaluate_clients=0,
        min_available_clients=settings["nodes"],
        initial_parameters=ndarrays_to_parameters(to_arrays(initial.state_dict())),
        on_fit_config_fn=lambda r: {"round": r},
    )
    started = time.perf_counter()
    start_simulation(
        client_fn=client_fn,
        num_clients=settings["nodes"],
        config=ServerConfig(num_rounds=settings["rounds"]),
        strategy=strategy,
        client_resources={"num_cpus": 1, "num_gpus": 0.0},
        ray_init_args={
            "num_cpus": trainers,
            "include_dashboard": False,
            "ignore_reinit_error": True,
            "logging_level": "ERROR",
        },
    )
    total = time.perf_counter() - started
    model = create_model(settings["model"], **splits.model_kwargs())
    model.load_state_dict(to_state(parameters_to_ndarrays(final[0])))
    accuracy = float(evaluate(model, *splits.test.tensors())["accuracy"])
    rounds = [end - start for _, (start, end) in sorted(times.items())]
    return {"flower_version": flwr.__version__, "round_s": rounds, "accuracy": accuracy, "total_s": total}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
