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
   slowest slowdown: what the slowest member needs for the base work). The job is one
   :class:`fl_node.job.config.JobConfig` with adaptive work (its nominal steps are the base work,
   its bound four times that); each member derives from it what a node's trainer derives
   (fl_node.job: the privacy plan, the training settings, the round's steps and learning-rate cap)
   and trains for real, through the one local round (:func:`fl_node.local_round.local_round`), on
   its IID share of the data. Fixed work runs the nominal steps every round and aggregates by
   FedAvg weighted by the samples processed (:func:`fl_node.scheduler.processed_samples`; the
   steps are equal, so these are the shares' weights). Adaptive work aggregates as the node's
   aggregator does (:func:`fl_node.job.aggregation.strategy`: normalized averaging, FedNova,
   each delta divided by its momentum-aware work norm, averaged with the shares' data weights,
   the nominal work's norm as the server step); plain FedAvg of 5..28-step deltas weighted by
   samples processed is biased towards the fast members' local optima and made the adaptive
   accuracy swing from seed to seed. Accuracy is measured on the test split.
   Under DP each member is charged for the steps it ran (:func:`fl_node.privacy_plan.train_release`),
   with noise calibrated for the most steps the controller may choose (the job's plan, both arms).
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
from fl_node.job import aggregation, training
from fl_node.job.config import JobConfig
from fl_node.job.plan import privacy_plan, update_mechanism
from fl_node.local_round import local_round
from fl_node.partition import partition
from fl_node.privacy import PrivacyHistory, rdp_epsilon
from fl_node.scheduler import AimdController, DeviceSlot, TaskDemand, place, processed_samples
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
class Members:
    """What the experiment alone needs beside the job: how many members, how unequal, their link."""

    count: int = 8
    low: float = 1.0  # the fastest member's step-time multiplier
    high: float = 4.0  # the slowest's
    link: Link = field(default_factory=Link)


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


def run_federation(
    job: JobConfig,
    members: Members,
    mode: str,
    splits: DatasetSplits,
    model: torch.nn.Module,
    step_pool: Sequence[float],
    *,
    on_round: Callable[[int, RoundTiming], None] | None = None,
) -> FederationRun:
    """One run of ``job`` (an adaptive-work job: its nominal steps are the base work) with fixed or
    AIMD-adaptive local work (see the module doc)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not job.adaptive_work:
        raise ValueError("the job sets the work's bounds: it needs adaptive_work and max_local_steps")
    if not step_pool or min(step_pool) <= 0:
        raise ValueError("the step-time pool must hold positive measurements")
    torch.manual_seed(job.seed)
    nominal = training.nominal_steps(job)
    factors = slowdowns(members.count, low=members.low, high=members.high)
    parts = partition(splits.train.y, members.count, "iid", seed=job.seed)
    shares = [splits.train.subset(part) for part in parts]
    # Each member's plan, as a node computes its own (no committee here: nothing is scored).
    plans = [
        privacy_plan(job, num_train=len(share), num_records=len(share), scores_per_round=0)
        for share in shares
    ]
    histories = [PrivacyHistory() for _ in shares]
    controllers = [AimdController(training.aimd_config(job)) for _ in shares]
    deadline = nominal * statistics.median(step_pool) * max(factors)
    # One generator for timing draws, seeded alike in both modes: same machine, same luck.
    draws = np.random.default_rng(job.seed)
    fedavg = get_strategy("fedavg")
    global_state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model_bytes = None
    timings: list[RoundTiming] = []
    accuracies: list[float] = []
    x_test, y_test = splits.test.tensors()
    for round_index in range(job.rounds):
        updates: list[WeightedUpdate] = []
        work_steps: dict[str, int] = {}
        steps: list[int] = []
        compute: list[float] = []
        busy: list[float] = []
        for i, share in enumerate(shares):
            work = controllers[i].steps if mode == "adaptive" else nominal
            settings = training.train_config(job, training.round_seed(job, round_index + 1, i), plans[i])
            # The node's round of ``work`` steps: the lr cap, and the release of exactly those steps.
            settings, release = training.adaptive_round(job, settings, plans[i], work)
            if release is not None:
                histories[i].record(
                    noise_multiplier=release.noise_multiplier,
                    sample_rate=release.sample_rate,
                    steps=release.steps,
                )
            result = local_round(
                model,
                global_state,
                share,
                settings,
                num_classes=splits.num_classes,
                mechanism=update_mechanism(plans[i]),
            )
            update_bytes = len(encode_update(result.update))
            if model_bytes is None:
                model_bytes = update_bytes  # a dense update is the model's size
            pool_draw = float(step_pool[int(draws.integers(len(step_pool)))])
            seconds = work * pool_draw * factors[i]
            compute.append(seconds)
            busy.append(members.link.seconds(model_bytes) + seconds + members.link.seconds(update_bytes))
            steps.append(work)
            member = f"member-{i:02d}"
            if mode == "adaptive":
                # FedNova: the data weight is the share's size; the work enters as the steps.
                updates.append(WeightedUpdate(result.update, len(share), member))
                work_steps[member] = work
            else:
                weight = processed_samples(work, job.batch_size, max_steps=job.max_local_steps)
                updates.append(WeightedUpdate(result.update, weight, member))
            controllers[i].observe(steps=work, seconds=seconds, target_seconds=deadline)
        strategy = aggregation.strategy(job, work_steps) if mode == "adaptive" else fedavg
        global_state, _ = strategy.aggregate(global_state, updates)
        model.load_state_dict(global_state)
        with torch.no_grad():
            accuracies.append(float(evaluate(model, x_test, y_test)["accuracy"]))
        timing = RoundTiming(tuple(steps), tuple(compute), tuple(busy), max(busy))
        timings.append(timing)
        if on_round is not None:
            on_round(round_index, timing)
    epsilons = (
        tuple(rdp_epsilon(history, delta=job.dp.delta) for history in histories) if job.dp.private else None
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
