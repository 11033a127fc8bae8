"""Unequal members and shared devices: discrete-event simulations with real training.

Two experiments of issue #18 (``bench/heterogeneity.py`` prints their figures):

1. **Fixed vs AIMD-adaptive work** (:func:`run_federation`). ``n`` members whose step times are
   ``slowdown`` (spread evenly from 1x to 4x) times a real step time of the real model,
   measured on this machine (:func:`measure_step_times`: a pool of per-step times from real
   local training, drawn per member and round by a seeded generator, so both modes see the
   same machine). A member's round is: download the global model, compute its steps, upload
   its update (bytes of the real encoded update / the link's bandwidth). The training phase
   ends when the last update is in; the members that finished earlier wait, and that waiting
   is the idle time. With fixed work every member runs ``base_steps``; with adaptive work each
   runs what its :class:`fl_node.scheduler.AimdController` chose from its own measured compute
   time against the job's training deadline (``base_steps`` x the typical step time x the
   slowest slowdown: what the slowest member needs for the base work). Training is real: every
   member trains the model on its IID share of the data for its steps. Fixed work aggregates by
   FedAvg weighted by the samples processed (:func:`fl_node.scheduler.processed_samples`; the
   steps are equal, so these are the shares' weights). Adaptive work aggregates by normalized
   averaging (FedNova, :func:`fl_node.normalized_average.normalized_average`): each delta divided
   by its momentum-aware work norm, averaged with the shares' data weights, scaled by the
   effective work; plain FedAvg of 5..28-step deltas weighted by samples processed is biased
   towards the fast members' local optima and made the adaptive accuracy swing from seed to
   seed. Accuracy is measured on the test split.
   Under DP each member is charged for the steps it ran (:func:`fl_node.privacy_plan.train_release`),
   with noise calibrated for the most steps the controller may choose.
2. **Three jobs on one node's slots** (:func:`simulate_node_jobs`). Each job's round is:
   download (link), compute (holds a device slot, placed by :func:`fl_node.scheduler.place`),
   upload (link), chain (transactions and the round's finalization: block latency, holds
   nothing on the node). With ``policy="overlap"`` all jobs run at once, so one job's
   transfers and chain waits overlap another's computation; ``"sequential"`` runs them one
   after another. No free compute: a compute phase runs only on a slot whose free capacity
   covers its demand (a task demanding the whole device runs alone on it), and concurrent
   transfers share the link's bandwidth equally.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.codec import encode_update
from fl_node.data import ArrayDataset, DatasetSplits
from fl_node.normalized_average import WorkUpdate, capped_lr, normalized_average, work_norm
from fl_node.partition import partition
from fl_node.privacy import PrivacyHistory, rdp_epsilon
from fl_node.privacy_plan import PrivacyPlan, plan_privacy, train_release
from fl_node.scheduler import AimdConfig, AimdController, DeviceSlot, TaskDemand, place, processed_samples
from fl_node.train import TrainConfig, evaluate, train_local

MODES = ("fixed", "adaptive")


def slowdowns(members: int, *, low: float = 1.0, high: float = 4.0) -> list[float]:
    """Step-time multipliers spread evenly from ``low`` (fastest) to ``high`` (slowest)."""
    if members < 1:
        raise ValueError("need at least one member")
    if not 0 < low <= high:
        raise ValueError("need 0 < low <= high")
    if members == 1:
        return [low]
    return [low + (high - low) * i / (members - 1) for i in range(members)]


@dataclass(frozen=True)
class Link:
    """A member's network link: transfers take bytes / bandwidth (100 Mbit/s by default)."""

    bandwidth_bytes_per_s: float = 12.5e6

    def seconds(self, num_bytes: int) -> float:
        return num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class FederationConfig:
    members: int = 8
    rounds: int = 10
    base_steps: int = 7  # about one epoch of a member's share of the MNIST subset at batch 64
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.5  # as fl_node.simulate; at 0.9 the mixed-work averages swing more (see bench)
    low: float = 1.0
    high: float = 4.0
    max_factor: int = 4  # the AIMD bound: at most max_factor x base_steps
    epsilon: float | None = None  # DP-SGD target per member for the job; None trains without DP
    delta: float = 1e-5
    link: Link = field(default_factory=Link)
    seed: int = 0
    # The adaptive arm's server step (fl_node.normalized_average): "mean" is FedNova's
    # sum_i p_i a_i; "base" is the work norm of base_steps, the fixed arm's step.
    effective_work: str = "mean"
    # The adaptive arm's learning-rate cap (fl_node.normalized_average.capped_lr), in units of
    # base_steps (0: none): a member running more than lr_cap x base_steps trains at a smaller
    # lr, so its local trajectory is no longer than that work's; the aggregation normalizes by
    # the capped work norm.
    lr_cap: int = 0

    @property
    def cap_steps(self) -> int | None:
        return self.lr_cap * self.base_steps if self.lr_cap else None

    @property
    def max_steps(self) -> int:
        return self.max_factor * self.base_steps


@dataclass(frozen=True)
class RoundTiming:
    steps: tuple[int, ...]
    compute_s: tuple[float, ...]
    busy_s: tuple[float, ...]
    round_s: float

    @property
    def idle_s(self) -> float:
        return sum(self.round_s - busy for busy in self.busy_s)


@dataclass(frozen=True)
class FederationRun:
    mode: str
    rounds: list[RoundTiming]
    accuracy: float  # on the test split after the last round
    epsilons: tuple[float, ...] | None  # per member after the job, under DP
    accuracies: tuple[float, ...] = ()  # after each round

    @property
    def wall_s(self) -> float:
        return sum(r.round_s for r in self.rounds)

    @property
    def idle_fraction(self) -> float:
        """Time members spent waiting for the slowest, over all members' time."""
        members = len(self.rounds[0].busy_s)
        return sum(r.idle_s for r in self.rounds) / (members * self.wall_s)

    @property
    def total_steps(self) -> int:
        return sum(sum(r.steps) for r in self.rounds)

    def summary(self) -> dict:
        return {
            "mode": self.mode,
            "accuracy": self.accuracy,
            "accuracies": [round(a, 4) for a in self.accuracies],
            "idle_fraction": self.idle_fraction,
            "wall_s": self.wall_s,
            "total_steps": self.total_steps,
            "last_round_steps": list(self.rounds[-1].steps),
            "epsilons": list(self.epsilons) if self.epsilons else None,
        }


def measure_step_times(
    model: torch.nn.Module,
    data: ArrayDataset,
    config: TrainConfig,
    *,
    samples: int = 12,
    steps: int = 7,
    clock: Callable[[], float] = time.process_time,
) -> list[float]:
    """Per-step seconds of real local training: ``samples`` timed runs of ``steps`` steps.

    The default clock is the process's CPU time: on a machine shared with other work (the
    2-core development box runs nine agents) wall time measures the neighbours' load (a CV
    of 20-50% there) while CPU time measures what a step costs this CPU (a CV of about 2% for
    the CNN, with torch on one thread). Pass ``time.perf_counter`` on a dedicated machine.
    """
    if samples < 1 or steps < 1:
        raise ValueError("samples and steps must be at least 1")
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    run = replace(config, local_steps=steps)
    train_local(model, state, data, run)  # warm-up: first-call allocations are not a step
    pool = []
    for _ in range(samples):
        start = clock()
        train_local(model, state, data, run)
        pool.append((clock() - start) / steps)
    model.load_state_dict(state)
    return pool


def _member_plan(config: FederationConfig, mode: str, num_train: int) -> PrivacyPlan | None:
    if config.epsilon is None:
        return None
    return plan_privacy(
        mode="sgd",
        target_epsilon=config.epsilon,
        delta=config.delta,
        rounds=config.rounds,
        num_train=num_train,
        num_records=num_train,
        batch_size=config.batch_size,
        local_steps=config.base_steps,
        max_local_steps=config.max_steps if mode == "adaptive" else None,
        scores_per_round=0,
    )


def _server_step(config: FederationConfig) -> float | None:
    if config.effective_work == "mean":
        return None
    if config.effective_work == "base":
        return work_norm(config.base_steps, config.momentum)
    raise ValueError(f"effective_work must be 'mean' or 'base', got {config.effective_work!r}")


def run_federation(
    config: FederationConfig,
    mode: str,
    splits: DatasetSplits,
    model: torch.nn.Module,
    step_pool: Sequence[float],
    *,
    on_round: Callable[[int, RoundTiming], None] | None = None,
) -> FederationRun:
    """One job of ``config.rounds`` rounds with fixed or AIMD-adaptive local work (see the module doc)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not step_pool or min(step_pool) <= 0:
        raise ValueError("the step-time pool must hold positive measurements")
    torch.manual_seed(config.seed)
    factors = slowdowns(config.members, low=config.low, high=config.high)
    parts = partition(splits.train.y, config.members, "iid", seed=config.seed)
    shares = [splits.train.subset(part) for part in parts]
    plans = [_member_plan(config, mode, len(share)) for share in shares]
    histories = [PrivacyHistory() for _ in shares]
    aimd = AimdConfig(base_steps=config.base_steps, max_steps=config.max_steps)
    controllers = [AimdController(aimd) for _ in shares]
    deadline = config.base_steps * statistics.median(step_pool) * max(factors)
    # One generator for timing draws, seeded alike in both modes: same machine, same luck.
    draws = np.random.default_rng(config.seed)
    fedavg = get_strategy("fedavg")
    global_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model_bytes = None
    timings: list[RoundTiming] = []
    accuracies: list[float] = []
    x_test, y_test = splits.test.tensors()
    for round_index in range(config.rounds):
        work_updates: list[WorkUpdate] = []  # adaptive (FedNova)
        weighted_updates: list[WeightedUpdate] = []  # fixed work (FedAvg)
        steps: list[int] = []
        compute: list[float] = []
        busy: list[float] = []
        for i, share in enumerate(shares):
            work = controllers[i].steps if mode == "adaptive" else config.base_steps
            noise = None
            plan = plans[i]
            if plan is not None:
                release = train_release(plan, work)
                if release is None:  # an "sgd" plan charges its training
                    raise ValueError("a member's privacy plan has no training release")
                histories[i].record(
                    noise_multiplier=release.noise_multiplier,
                    sample_rate=release.sample_rate,
                    steps=release.steps,
                )
                noise = plan.sgd_noise_multiplier
            lr = config.lr
            if mode == "adaptive" and config.cap_steps:
                lr = capped_lr(config.lr, work, cap_steps=config.cap_steps, momentum=config.momentum)
            train = TrainConfig(
                batch_size=config.batch_size,
                local_steps=work,
                lr=lr,
                momentum=config.momentum,
                noise_multiplier=noise,
                delta=config.delta,
                seed=config.seed * 1_000_003 + round_index * 1009 + i,
            )
            result = train_local(model, global_state, share, train)
            update_bytes = len(encode_update(result.update))
            if model_bytes is None:
                model_bytes = update_bytes  # a dense update is the model's size
            pool_draw = float(step_pool[int(draws.integers(len(step_pool)))])
            seconds = work * pool_draw * factors[i]
            compute.append(seconds)
            busy.append(config.link.seconds(model_bytes) + seconds + config.link.seconds(update_bytes))
            steps.append(work)
            if mode == "adaptive":
                # FedNova: the data weight is the share's size; the work enters as the steps.
                work_updates.append(WorkUpdate(result.update, len(share), work, f"member-{i:02d}"))
            else:
                weight = processed_samples(work, config.batch_size, max_steps=config.max_steps)
                weighted_updates.append(WeightedUpdate(result.update, weight, f"member-{i:02d}"))
            controllers[i].observe(steps=work, seconds=seconds, target_seconds=deadline)
        if mode == "adaptive":
            global_state = normalized_average(
                global_state,
                work_updates,
                max_steps=config.max_steps,
                momentum=config.momentum,
                tau_eff=_server_step(config),
                cap_steps=config.cap_steps,
            )
        else:
            global_state, _ = fedavg.aggregate(global_state, weighted_updates)
        model.load_state_dict(global_state)
        with torch.no_grad():
            accuracies.append(float(evaluate(model, x_test, y_test)["accuracy"]))
        timing = RoundTiming(tuple(steps), tuple(compute), tuple(busy), max(busy))
        timings.append(timing)
        if on_round is not None:
            on_round(round_index, timing)
    epsilons = (
        tuple(rdp_epsilon(history, delta=config.delta) for history in histories)
        if config.epsilon is not None
        else None
    )
    return FederationRun(mode, timings, accuracies[-1], epsilons, tuple(accuracies))


# ---------------------------------------------------------------- several jobs on one node


@dataclass(frozen=True)
class JobWork:
    """One job's rounds on this node: per round download, compute (on a slot), upload, chain."""

    name: str
    compute_s: tuple[float, ...]  # per round, measured at the demand's cores
    download_bytes: int
    upload_bytes: int
    chain_s: float  # per round: transactions and the round's finalization (holds nothing here)
    demand: TaskDemand = field(default_factory=lambda: TaskDemand("cpu", 1))

    def __post_init__(self) -> None:
        if not self.compute_s or min(self.compute_s) < 0:
            raise ValueError(f"job {self.name!r} needs at least one round of non-negative compute")
        if self.download_bytes < 0 or self.upload_bytes < 0 or self.chain_s < 0:
            raise ValueError(f"job {self.name!r}: bytes and chain time must not be negative")

    @property
    def rounds(self) -> int:
        return len(self.compute_s)

    def phases(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        for seconds in self.compute_s:
            out += [
                ("link", float(self.download_bytes)),
                ("compute", seconds),
                ("link", float(self.upload_bytes)),
                ("chain", self.chain_s),
            ]
        return out


@dataclass(frozen=True)
class NodeRun:
    policy: str
    makespan_s: float
    finish_s: dict[str, float]
    slot_busy_s: dict[str, float]  # seconds each slot had at least one compute task
    peak_used: dict[str, int]  # the most capacity ever held at once, per slot

    def summary(self) -> dict:
        return {
            "policy": self.policy,
            "makespan_s": self.makespan_s,
            "finish_s": self.finish_s,
            "slot_utilisation": {k: v / self.makespan_s for k, v in self.slot_busy_s.items()},
            "peak_used": self.peak_used,
        }


@dataclass
class _JobState:
    job: JobWork
    phases: list[tuple[str, float]]
    index: int = 0
    remaining: float = 0.0
    running: bool = False
    slot: DeviceSlot | None = None
    started: bool = False

    @property
    def done(self) -> bool:
        return self.index >= len(self.phases)


def simulate_node_jobs(
    jobs: Sequence[JobWork],
    slots: Sequence[DeviceSlot],
    *,
    bandwidth_bytes_per_s: float,
    policy: str = "overlap",
) -> NodeRun:
    """Discrete-event run of ``jobs`` on one node (see the module doc); ``slots`` start empty.

    ``policy`` "overlap": every job runs from time 0; compute tasks wait in job order (the
    priority) for a slot that fits, placed greedily. "sequential": a job starts when the one
    before it has finished all its rounds. Transfers in flight share the bandwidth equally.
    """
    if policy not in ("overlap", "sequential"):
        raise ValueError(f"unknown policy {policy!r}")
    if not bandwidth_bytes_per_s > 0:
        raise ValueError("bandwidth must be positive")
    for slot in slots:
        if slot.tasks:
            raise ValueError(f"slot {slot.key} must start empty")
    for job in jobs:
        kinds = {"cuda", "cpu"} if job.demand.kind == "auto" else {job.demand.kind}
        if not any(s.kind in kinds and job.demand.amount_for(s.kind) <= s.capacity for s in slots):
            raise ValueError(f"job {job.name!r} fits on no slot: it would wait forever")
    states = [_JobState(job, job.phases()) for job in jobs]
    now = 0.0
    finish: dict[str, float] = {}
    busy = {f"{slot.worker}/{slot.device.name}": 0.0 for slot in slots}
    names = list(busy)
    peak = dict.fromkeys(names, 0)

    def startable(k: int) -> bool:
        return policy == "overlap" or all(s.done for s in states[:k])

    while not all(s.done for s in states):
        # Start what can start, in job order (the first job has the highest priority).
        for k, state in enumerate(states):
            if state.done or state.running or not startable(k):
                continue
            kind, amount = state.phases[state.index]
            if kind == "compute":
                placed = place(state.job.demand, slots)
                if placed is None:
                    continue  # queued until a slot frees
                placed.assign(state.job.name, state.job.demand)
                state.slot = placed
            state.remaining, state.running, state.started = amount, True, True
        for name, slot in zip(names, slots, strict=True):
            peak[name] = max(peak[name], slot.used)
            assert slot.used <= slot.capacity  # place() never over-commits a slot
        running = [s for s in states if s.running]
        if not running:  # cannot happen: every job fits on an empty slot (checked above)
            raise RuntimeError("no phase can run")
        transfers = sum(1 for s in running if s.phases[s.index][0] == "link")

        rates = {
            id(s): bandwidth_bytes_per_s / transfers if s.phases[s.index][0] == "link" else 1.0
            for s in running
        }

        step = min(s.remaining / rates[id(s)] for s in running)
        for name, slot in zip(names, slots, strict=True):
            if slot.tasks:
                busy[name] += step
        now += step
        for state in running:
            state.remaining -= step * rates[id(state)]
            if state.remaining <= 1e-9 * max(1.0, rates[id(state)]):
                if state.slot is not None:
                    state.slot.release(state.job.name)
                    state.slot = None
                state.running = False
                state.index += 1
                if state.done:
                    finish[state.job.name] = now
    return NodeRun(policy, now, finish, busy, peak)


def job_rounds_from_pool(
    step_pool: Sequence[float], *, steps: int, rounds: int, seed: int, slowdown: float = 1.0
) -> tuple[float, ...]:
    """Per-round compute seconds of a job: ``steps`` x a measured step time drawn per round."""
    if steps < 1 or rounds < 1:
        raise ValueError("steps and rounds must be at least 1")
    rng = np.random.default_rng(seed)
    return tuple(
        steps * float(step_pool[int(rng.integers(len(step_pool)))]) * slowdown for _ in range(rounds)
    )


def idle_ratio(adaptive: FederationRun, fixed: FederationRun) -> float:
    """Waiting time of the adaptive run over the fixed run's (as fractions of their time)."""
    if fixed.idle_fraction == 0:
        return math.inf if adaptive.idle_fraction > 0 else 1.0
    return adaptive.idle_fraction / fixed.idle_fraction
