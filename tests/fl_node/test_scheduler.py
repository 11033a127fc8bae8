"""fl_node.scheduler: slots and greedy placement, the AIMD controller, weights and privacy charges."""

from __future__ import annotations

import math

import pytest

from fl_node.privacy import PrivacyHistory, rdp_epsilon
from fl_node.privacy_plan import plan_privacy, train_release
from fl_node.scheduler import (
    AimdConfig,
    AimdController,
    Device,
    DeviceSlot,
    TaskDemand,
    discover_devices,
    place,
    processed_samples,
    slots_for,
)

# ---------------------------------------------------------------- devices and placement


def test_discover_devices_reports_this_process_cores():
    import os

    devices = discover_devices()
    cpu = [d for d in devices if d.kind == "cpu"]
    assert len(cpu) == 1 and cpu[0].capacity == len(os.sched_getaffinity(0))
    import torch

    gpus = [d for d in devices if d.kind == "cuda"]
    assert len(gpus) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert all(g.capacity > 0 for g in gpus)


@pytest.mark.parametrize("capacity", [0, -1, 1.5])
def test_device_rejects_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        Device("cpu", "cpu", capacity)


def test_place_picks_most_free_and_respects_capacity():
    slots = slots_for("w1", [Device("cpu", "cpu", 4)]) + slots_for("w2", [Device("cpu", "cpu", 4)])
    demand = TaskDemand("cpu", cores=2)
    placed = []
    for task in range(5):
        slot = place(demand, slots)
        if slot is None:
            placed.append(None)
            continue
        slot.assign(f"t{task}", demand)
        placed.append(slot.worker)
        assert all(s.used <= s.capacity for s in slots)
    # Ties go to the smaller key, then the emptier slot: w1, w2, w1, w2, then nothing fits.
    assert placed == ["w1", "w2", "w1", "w2", None]
    slots[1].release("t1")
    assert place(demand, slots) is slots[1]


def test_several_jobs_share_one_device_until_full():
    slot = DeviceSlot("w", Device("cuda:0", "cuda", 10_000))
    demand = TaskDemand("cuda", gpu_memory_mb=3_000)
    for task in range(3):
        assert place(demand, [slot]) is slot
        slot.assign(f"job{task}", demand)
    assert slot.used == 9_000 and place(demand, [slot]) is None
    with pytest.raises(ValueError, match="does not fit"):
        slot.assign("job3", demand)
    with pytest.raises(ValueError, match="already"):
        slot.assign("job0", TaskDemand("cuda", gpu_memory_mb=1))


def test_auto_prefers_gpu_and_falls_back_to_cpu():
    cpu = DeviceSlot("w", Device("cpu", "cpu", 8))
    gpu = DeviceSlot("w", Device("cuda:0", "cuda", 4_000))
    demand = TaskDemand("auto", cores=2, gpu_memory_mb=3_000)
    assert place(demand, [cpu, gpu]) is gpu
    gpu.assign("a", demand)
    assert place(demand, [cpu, gpu]) is cpu  # 1,000 MB left on the GPU: too little
    assert place(TaskDemand("cuda", gpu_memory_mb=3_000), [cpu, gpu]) is None


def test_placement_is_deterministic_whatever_the_order():
    slots = [DeviceSlot(f"w{i}", Device("cpu", "cpu", 4)) for i in (3, 1, 2)]
    assert place(TaskDemand("cpu"), slots).worker == "w1"
    assert place(TaskDemand("cpu"), list(reversed(slots))).worker == "w1"


@pytest.mark.parametrize("kwargs", [{"kind": "tpu"}, {"cores": 0}, {"gpu_memory_mb": -5}])
def test_demand_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        TaskDemand(**kwargs)


# ---------------------------------------------------------------- AIMD


def _run(controller: AimdController, step_time: float, target: float, rounds: int) -> list[int]:
    history = []
    for _ in range(rounds):
        steps = controller.steps
        history.append(steps)
        controller.observe(steps=steps, seconds=steps * step_time, target_seconds=target)
    return history


def test_aimd_converges_for_unequal_speeds_to_equal_finish_times():
    base = 10
    target = base * 0.4  # the slowest member's time for the base work
    finish = {}
    for slowdown in (1.0, 1.5, 2.0, 3.0, 4.0):
        controller = AimdController(AimdConfig(base_steps=base))
        history = _run(controller, 0.1 * slowdown, target, 12)
        # Settled: the last rounds no longer move, and finish inside [1 - headroom, 1] x target.
        assert len(set(history[-4:])) == 1
        finish[slowdown] = history[-1] * 0.1 * slowdown
        assert 0.9 * target <= finish[slowdown] <= target
    fast = AimdController(AimdConfig(base_steps=base))
    assert _run(fast, 0.1, target, 12)[-1] > 3 * base  # the 4x faster member does > 3x the work
    assert max(finish.values()) - min(finish.values()) <= 0.1 * target


def test_aimd_backs_off_multiplicatively_on_a_slow_round_then_recovers_additively():
    cfg = AimdConfig(base_steps=20, decrease=0.5, increase=2)
    controller = AimdController(cfg)
    _run(controller, 0.05, 2.0, 6)  # settles at 39 steps (1.95 s)
    settled = controller.steps
    assert settled == 39
    # A slow round (the machine got busy): the work halves.
    assert controller.observe(steps=settled, seconds=settled * 0.2, target_seconds=2.0) == 19
    # Back to normal speed: the work grows again by at most 2 steps a round (no more
    # doubling; held while the step-time estimate still remembers the slow round) and
    # returns to where it was.
    history = [19]
    for _ in range(20):
        history.append(controller.observe(steps=history[-1], seconds=history[-1] * 0.05, target_seconds=2.0))
    steps_up = [b - a for a, b in zip(history, history[1:], strict=False)]
    assert all(0 <= up <= 2 for up in steps_up) and 2 in steps_up
    assert 37 <= history[-1] <= 39  # the deviation estimate fades geometrically


def test_aimd_plans_a_margin_for_jittery_steps():
    steady, jittery = AimdController(AimdConfig(base_steps=10)), AimdController(AimdConfig(base_steps=10))
    for round_index in range(30):
        steady.observe(steps=steady.steps, seconds=steady.steps * 0.1, target_seconds=4.0)
        step = 0.08 if round_index % 2 else 0.12  # the same mean, +-20%
        jittery.observe(steps=jittery.steps, seconds=jittery.steps * step, target_seconds=4.0)
    assert jittery.steps < steady.steps


def test_aimd_is_bounded_and_deterministic():
    cfg = AimdConfig(base_steps=8, min_steps=2, max_steps=20)
    very_fast = AimdController(cfg)
    assert _run(very_fast, 1e-6, 10.0, 10)[-1] == 20
    very_slow = AimdController(cfg)
    assert _run(very_slow, 100.0, 1.0, 20)[-1] == 2
    a, b = AimdController(cfg), AimdController(cfg)
    times = [0.3, 0.1, 0.5, 0.2, 0.2, 0.9, 0.1]
    assert [a.observe(steps=a.steps, seconds=a.steps * t, target_seconds=4) for t in times] == [
        b.observe(steps=b.steps, seconds=b.steps * t, target_seconds=4) for t in times
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0, "seconds": 1.0, "target_seconds": 1.0},
        {"steps": 5, "seconds": math.nan, "target_seconds": 1.0},
        {"steps": 5, "seconds": 1.0, "target_seconds": math.inf},
        {"steps": 5, "seconds": -1.0, "target_seconds": 1.0},
    ],
)
def test_aimd_rejects_bad_measurements(kwargs):
    controller = AimdController(AimdConfig(base_steps=5))
    with pytest.raises(ValueError):
        controller.observe(**kwargs)
    assert controller.steps == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_steps": 0},
        {"base_steps": 5, "max_steps": 4},
        {"base_steps": 5, "max_steps": 7.5},
        {"base_steps": 5, "decrease": 1.0},
        {"base_steps": 5, "decrease": math.nan},
    ],
)
def test_aimd_config_rejects_bad_bounds(kwargs):
    with pytest.raises(ValueError):
        AimdConfig(**kwargs)


# ---------------------------------------------------------------- weights and privacy


def test_processed_samples_follow_steps_and_are_capped():
    assert processed_samples(10, 32, max_steps=40) == 320
    assert processed_samples(40, 32, max_steps=40) == 1280
    # A trainer claiming more work than the job allows gets the cap, not its claim.
    assert processed_samples(10**9, 32, max_steps=40) == 1280
    assert processed_samples(-3, 32, max_steps=40) == 32


def _plan(max_local_steps=None):
    return plan_privacy(
        mode="sgd",
        target_epsilon=3.0,
        delta=1e-5,
        rounds=10,
        num_train=1_000,
        num_records=1_000,
        batch_size=50,
        local_steps=10,
        max_local_steps=max_local_steps,
        scores_per_round=0,
    )


def test_privacy_charge_grows_with_steps_and_stays_within_target():
    plan = _plan(max_local_steps=40)
    charges = []
    for steps in (5, 10, 20, 40):
        history = PrivacyHistory()
        release = train_release(plan, steps)
        assert release.steps == steps
        history.record(
            noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=steps
        )
        charges.append(rdp_epsilon(history, delta=1e-5))
    assert charges == sorted(charges) and charges[0] < charges[-1]
    # Ten rounds at the most steps the controller may pick stay within the target.
    history = PrivacyHistory()
    for _ in range(10):
        release = train_release(plan, 40)
        history.record(noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=40)
    assert rdp_epsilon(history, delta=1e-5) <= 3.0 + 1e-6
    # Variable work costs noise: calibrated for 4x the steps, the noise is larger.
    assert plan.sgd_noise_multiplier > _plan().sgd_noise_multiplier
    with pytest.raises(ValueError, match="steps"):
        train_release(plan, 41)


def test_fixed_plan_is_unchanged_and_refuses_extra_steps():
    plan = _plan()
    assert plan.train.steps == 10
    assert train_release(plan, 10) == plan.train
    with pytest.raises(ValueError):
        train_release(plan, 11)
    with pytest.raises(ValueError, match="max_local_steps"):
        _plan(max_local_steps=0)


def test_aimd_state_round_trips_and_rejects_bad_values():
    cfg = AimdConfig(base_steps=10)
    controller = AimdController(cfg)
    for seconds in (0.5, 0.7, 0.6):
        controller.observe(steps=controller.steps, seconds=seconds, target_seconds=4.0)
    restored = AimdController.restore(cfg, controller.state())
    assert restored.state() == controller.state()
    assert restored.observe(steps=restored.steps, seconds=1.0, target_seconds=4.0) == controller.observe(
        steps=controller.steps, seconds=1.0, target_seconds=4.0
    )
    assert AimdController.restore(cfg, {"steps": 10**9}).steps == cfg.upper
    for bad in ({"steps": "7"}, {"step_time": -1.0}, {"deviation": math.nan}):
        with pytest.raises(ValueError):
            AimdController.restore(cfg, bad)
