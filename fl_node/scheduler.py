"""Device slots, greedy placement and AIMD work rebalancing: pure algorithms, no Django.

A node's workers declare their devices as **slots** (a CPU's cores, a GPU's memory in MB);
several jobs' local-training tasks share a slot while their demands fit its capacity.

* :func:`place` puts a task on the slot with the most free capacity (greedy, as the Vapor
  scheduler places jobs), ties broken by ``(worker, device)`` so every node decides alike.
  Only computation holds a slot: a job's swarm transfers and transactions run outside it, so
  another job computes on the same device meanwhile (compute/communication overlap).
* :class:`AimdController` sets how many local steps a trainer runs per round from its measured
  step time and the round's target time (the deadline, or the slowest peer's compute time):
  additive increase while it would finish early, multiplicative decrease when it ran late,
  bounded by ``[min_steps, max_steps]``. Fast members then do more work instead of idling.
* The chosen work is what the aggregation weights (:func:`processed_samples`, capped so a
  trainer cannot claim more than the job allows) and the privacy charge
  (:func:`fl_node.privacy_plan.train_release`, more steps cost more) are computed from.

Stable API (imported by ``backend``): ``Device``, ``DeviceSlot``, ``TaskDemand``,
``discover_devices``, ``slots_for``, ``place``, ``AimdConfig``, ``AimdController`` (``observe``,
``state`` / ``restore`` to keep it between rounds),
``processed_samples``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DEVICE_KINDS = ("cpu", "cuda")
DEMAND_KINDS = ("cpu", "cuda", "auto")


@dataclass(frozen=True)
class Device:
    """One device of a worker: ``capacity`` is CPU cores (kind "cpu") or GPU memory in MB ("cuda")."""

    name: str  # "cpu" or "cuda:0"
    kind: str
    capacity: int
    label: str = ""  # e.g. the GPU's model name

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"device kind must be one of {DEVICE_KINDS}, got {self.kind!r}")
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"device capacity must be a positive integer, got {self.capacity!r}")

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "capacity": self.capacity, "label": self.label}


def discover_devices(*, include_gpu: bool = True) -> list[Device]:
    """This machine's devices: the CPU cores this process may run on, and each GPU torch sees.

    Cores come from ``os.sched_getaffinity`` (a container's or taskset's limit, not the host's
    count); each GPU's capacity is its total memory in MB.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    devices = [Device("cpu", "cpu", max(1, cores), "cpu")]
    if include_gpu:
        import torch  # only here: placement itself needs no torch

        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                memory_mb = max(1, int(props.total_memory // (1024 * 1024)))
                devices.append(Device(f"cuda:{index}", "cuda", memory_mb, props.name))
    return devices


@dataclass(frozen=True)
class TaskDemand:
    """What one local-training task holds while it computes.

    ``kind`` "cpu" needs ``cores`` of a CPU slot; "cuda" needs ``gpu_memory_mb`` of a GPU slot;
    "auto" takes a GPU slot where one fits, else a CPU slot.
    """

    kind: str = "auto"
    cores: int = 1
    gpu_memory_mb: int = 1024

    def __post_init__(self) -> None:
        if self.kind not in DEMAND_KINDS:
            raise ValueError(f"demand kind must be one of {DEMAND_KINDS}, got {self.kind!r}")
        if not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"cores must be a positive integer, got {self.cores!r}")
        if not isinstance(self.gpu_memory_mb, int) or self.gpu_memory_mb < 1:
            raise ValueError(f"gpu_memory_mb must be a positive integer, got {self.gpu_memory_mb!r}")

    def amount_for(self, kind: str) -> int:
        """The capacity this task takes on a slot of ``kind``."""
        return self.cores if kind == "cpu" else self.gpu_memory_mb


@dataclass
class DeviceSlot:
    """A worker's device with the tasks currently holding part of it (task id -> amount)."""

    worker: str
    device: Device
    tasks: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.worker, self.device.name)

    @property
    def kind(self) -> str:
        return self.device.kind

    @property
    def capacity(self) -> int:
        return self.device.capacity

    @property
    def used(self) -> int:
        return sum(self.tasks.values())

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def load(self) -> float:
        """The fraction of the capacity in use, 0..1."""
        return self.used / self.capacity

    def fits(self, demand: TaskDemand) -> bool:
        return demand.amount_for(self.kind) <= self.free

    def assign(self, task_id: str, demand: TaskDemand) -> None:
        """Reserve ``demand`` for ``task_id``; ValueError if it does not fit or is already here."""
        if task_id in self.tasks:
            raise ValueError(f"task {task_id!r} already holds {self.key}")
        if not self.fits(demand):
            raise ValueError(f"task {task_id!r} does not fit on {self.key}: {self.free} free")
        self.tasks[task_id] = demand.amount_for(self.kind)

    def release(self, task_id: str) -> None:
        """Free what ``task_id`` held (no-op when it holds nothing here)."""
        self.tasks.pop(task_id, None)

    def as_dict(self) -> dict[str, object]:
        return {
            "worker": self.worker,
            "device": self.device.as_dict(),
            "used": self.used,
            "free": self.free,
            "load": self.load,
            "tasks": dict(self.tasks),
        }


def slots_for(worker: str, devices: Iterable[Device]) -> list[DeviceSlot]:
    """Empty slots for ``worker``'s devices."""
    return [DeviceSlot(worker, device) for device in devices]


def place(demand: TaskDemand, slots: Sequence[DeviceSlot]) -> DeviceSlot | None:
    """The slot ``demand`` goes on, or None when none fits (the task waits in the queue).

    Greedy: among the slots of the right kind where the demand fits, the one with the most
    free capacity as a fraction of its own (cores and MB do not compare), then the most free
    in absolute terms, then the smallest ``(worker, device)`` key. "auto" prefers GPU slots.
    Pure: the caller assigns the task to the returned slot.
    """
    kinds = ("cuda", "cpu") if demand.kind == "auto" else (demand.kind,)
    for kind in kinds:
        fitting = [slot for slot in slots if slot.kind == kind and slot.fits(demand)]
        if fitting:
            return min(fitting, key=lambda slot: (-slot.free / slot.capacity, -slot.free, slot.key))
    return None


# ---------------------------------------------------------------- AIMD work per round


@dataclass(frozen=True)
class AimdConfig:
    """Bounds and gains of :class:`AimdController`.

    ``increase`` steps are added after a round that finished before ``(1 - headroom)`` of the
    target (doubled instead while in slow start, before the first round that reached the
    target); the work is multiplied by ``decrease`` after a round that ran past the target.
    The increase never jumps past what the measured step time predicts fits in the target,
    so a fast member reaches its share in a few rounds and then saws only slightly around it.
    The prediction uses a smoothed step time plus ``deviations`` smoothed deviations (TCP's
    estimator), so a member with jittery steps plans a margin instead of being late every
    other round.
    """

    base_steps: int
    min_steps: int = 1
    max_steps: int | None = None  # default 4 x base_steps
    increase: int | None = None  # default max(1, base_steps // 4)
    decrease: float = 0.8
    headroom: float = 0.05
    smoothing: float = 0.25  # gain of the step-time and deviation averages
    deviations: float = 1.0  # plan for the smoothed step time plus this many deviations

    def __post_init__(self) -> None:
        if not isinstance(self.base_steps, int) or self.base_steps < 1:
            raise ValueError(f"base_steps must be a positive integer, got {self.base_steps!r}")
        if not isinstance(self.min_steps, int) or self.min_steps < 1:
            raise ValueError(f"min_steps must be a positive integer, got {self.min_steps!r}")
        if self.max_steps is not None and (
            not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool)
        ):
            raise ValueError(f"max_steps must be an integer, got {self.max_steps!r}")
        if self.upper < self.min_steps or not self.min_steps <= self.base_steps <= self.upper:
            raise ValueError("need min_steps <= base_steps <= max_steps")
        if self.increase is not None and (not isinstance(self.increase, int) or self.increase < 1):
            raise ValueError(f"increase must be a positive integer, got {self.increase!r}")
        if not 0 < self.decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {self.decrease}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if not (math.isfinite(self.deviations) and self.deviations >= 0):
            raise ValueError(f"deviations must be a non-negative number, got {self.deviations}")

    @property
    def upper(self) -> int:
        return self.max_steps if self.max_steps is not None else 4 * self.base_steps

    @property
    def step_increase(self) -> int:
        return self.increase if self.increase is not None else max(1, self.base_steps // 4)


class AimdController:
    """One trainer's local steps per round, rebalanced from its own measured step time.

    Deterministic: the next work depends only on the config, the current work, and the
    round's observation (``steps`` run, ``seconds`` they took, the round's ``target_seconds``).
    """

    def __init__(self, config: AimdConfig) -> None:
        self.config = config
        self.steps = config.base_steps
        # TCP's slow start: double until the first round near or past the target, then
        # additive increase; a member 4x faster than the deadline needs reaches it in 2 rounds.
        self.slow_start = True
        self.step_time: float | None = None  # smoothed seconds per step
        self.deviation = 0.0  # smoothed absolute deviation of the step time

    def observe(self, *, steps: int, seconds: float, target_seconds: float) -> int:
        """Update from one round's measurement; returns the steps for the next round."""
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds must be a positive finite number, got {seconds!r}")
        if not (math.isfinite(target_seconds) and target_seconds > 0):
            raise ValueError(f"target_seconds must be a positive finite number, got {target_seconds!r}")
        cfg = self.config
        sample = seconds / steps
        if self.step_time is None:
            self.step_time, self.deviation = sample, 0.0
        else:
            # TCP's RTT estimator (Jacobson 1988): smoothed mean and mean deviation.
            self.deviation += cfg.smoothing * (abs(sample - self.step_time) - self.deviation)
            self.step_time += cfg.smoothing * (sample - self.step_time)
        if seconds > target_seconds:
            proposed = math.floor(self.steps * cfg.decrease)
            self.slow_start = False
        elif seconds < (1 - cfg.headroom) * target_seconds:
            # Plan for a step a little slower than usual, so that ordinary jitter does not make
            # the round late. The tiny slack keeps float rounding (1.95 / 0.05 = 38.999...)
            # from losing a step.
            careful = self.step_time + cfg.deviations * self.deviation
            predicted = math.floor((1 - cfg.headroom / 2) * target_seconds / careful + 1e-9)
            grown = 2 * self.steps if self.slow_start else self.steps + cfg.step_increase
            proposed = max(self.steps, min(grown, predicted))
            if grown >= predicted:
                self.slow_start = False
        else:
            proposed = self.steps
            self.slow_start = False
        self.steps = min(cfg.upper, max(cfg.min_steps, proposed))
        return self.steps

    def state(self) -> dict[str, object]:
        """The controller's state as JSON-able values, to keep between rounds (e.g. in a database)."""
        return {
            "steps": self.steps,
            "slow_start": self.slow_start,
            "step_time": self.step_time,
            "deviation": self.deviation,
        }

    @classmethod
    def restore(cls, config: AimdConfig, state: dict[str, object]) -> AimdController:
        """A controller continuing from :meth:`state`; out-of-range values are refused or clamped."""
        controller = cls(config)
        steps = state.get("steps", config.base_steps)
        if not isinstance(steps, int) or isinstance(steps, bool):
            raise ValueError(f"steps must be an integer, got {steps!r}")
        controller.steps = min(config.upper, max(config.min_steps, steps))
        controller.slow_start = bool(state.get("slow_start", True))
        step_time = state.get("step_time")
        deviation = state.get("deviation", 0.0)
        if step_time is not None:
            if not isinstance(step_time, int | float) or not (math.isfinite(step_time) and step_time > 0):
                raise ValueError(f"step_time must be a positive number, got {step_time!r}")
            controller.step_time = float(step_time)
        if not isinstance(deviation, int | float) or not (math.isfinite(deviation) and deviation >= 0):
            raise ValueError(f"deviation must be a non-negative number, got {deviation!r}")
        controller.deviation = float(deviation)
        return controller


def processed_samples(steps: int, batch_size: int, *, max_steps: int) -> int:
    """The aggregation weight of an update: the samples its local steps processed.

    ``steps`` is what the trainer reports; it is clamped to ``[1, max_steps]`` (the job's AIMD
    bound) so no trainer can claim more weight than the job allows.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    return min(max(int(steps), 1), max_steps) * batch_size
