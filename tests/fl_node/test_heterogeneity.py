"""fl_node.heterogeneity: unequal members with fixed vs AIMD work, and jobs sharing a node's slots."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.heterogeneity import (
    JobWork,
    Members,
    idle_ratio,
    job_rounds_from_pool,
    measure_step_times,
    run_federation,
    simulate_node_jobs,
    slowdowns,
)
from fl_node.job.config import DPConfig
from fl_node.job.simulated import job_for
from fl_node.scheduler import Device, DeviceSlot, TaskDemand, processed_samples
from fl_node.simulate import prepared_model_and_data
from fl_node.train import TrainConfig


@pytest.fixture(scope="module")
def digits():
    torch.set_num_threads(1)
    return prepared_model_and_data("digits", "mlp", seed=0)


def adaptive_job(splits, *, base_steps: int, rounds: int, epsilon: float | None = None, **fields):
    """An adaptive-work job whose nominal steps are ``base_steps`` (the bound is four times that)."""
    dp = DPConfig(mode="sgd", target_epsilon=epsilon, delta=1e-4) if epsilon else DPConfig(mode="none")
    return job_for(
        splits,
        "mlp",
        rounds=rounds,
        batch_size=16,
        adaptive_work=True,
        max_local_steps=4 * base_steps,
        dp=dp,
        **fields,
    )


def test_slowdowns_spread_evenly():
    assert slowdowns(8) == pytest.approx([1 + 3 * i / 7 for i in range(8)])
    assert slowdowns(1) == [1.0]
    with pytest.raises(ValueError):
        slowdowns(0)


def test_measure_step_times_times_real_steps(digits):
    splits, model = digits
    pool = measure_step_times(
        copy.deepcopy(model), splits.train, TrainConfig(batch_size=16), samples=3, steps=2
    )
    assert len(pool) == 3 and all(0 < t < 5 for t in pool)


def test_adaptive_work_cuts_idle_time_and_keeps_accuracy(digits):
    splits, model = digits
    job = adaptive_job(splits, base_steps=6, rounds=6)
    pool = [0.01]  # a steady step time: the waiting is then only the members' unequal speeds
    fixed = run_federation(job, Members(4), "fixed", splits, copy.deepcopy(model), pool)
    adaptive = run_federation(job, Members(4), "adaptive", splits, copy.deepcopy(model), pool)
    assert all(timing.steps == (6, 6, 6, 6) for timing in fixed.rounds)
    last = adaptive.rounds[-1].steps
    assert last[0] > last[-1] and last[0] <= job.max_local_steps  # the fastest does the most work
    assert fixed.idle_fraction > 0.3
    assert idle_ratio(adaptive, fixed) <= 0.5
    # The same rounds of the slowest member's deadline: adaptive rounds are no longer.
    assert adaptive.wall_s <= fixed.wall_s * 1.001
    assert adaptive.accuracy >= fixed.accuracy - 0.05


def test_adaptive_work_is_charged_to_privacy(digits):
    splits, model = digits
    job = adaptive_job(splits, base_steps=3, rounds=3, epsilon=4.0)
    run = run_federation(job, Members(4), "adaptive", splits, copy.deepcopy(model), [0.01])
    steps = [sum(timing.steps[i] for timing in run.rounds) for i in range(4)]
    assert steps[0] > steps[-1]
    # The fastest member ran more steps and spent more; everyone stays within the target.
    assert run.epsilons[0] > run.epsilons[-1]
    assert max(run.epsilons) <= 4.0 + 1e-6


def test_the_adaptive_arm_aggregates_as_the_node_does_and_needs_an_adaptive_job(digits):
    splits, model = digits
    job = adaptive_job(splits, base_steps=2, rounds=2)
    run = run_federation(job, Members(2), "adaptive", splits, copy.deepcopy(model), [0.01])
    assert len(run.accuracies) == 2 and 0 <= run.accuracy <= 1
    fixed_job = replace(job, adaptive_work=False, max_local_steps=0)
    with pytest.raises(ValueError, match="adaptive_work"):
        run_federation(fixed_job, Members(2), "adaptive", splits, copy.deepcopy(model), [0.01])


def test_aggregation_weights_follow_the_samples_processed():
    base = {"w": torch.zeros(3)}
    first, second = {"w": torch.tensor([1.0, 0.0, 0.0])}, {"w": torch.tensor([0.0, 1.0, 0.0])}
    updates = [
        WeightedUpdate(first, processed_samples(10, 16, max_steps=40), "a"),
        WeightedUpdate(second, processed_samples(30, 16, max_steps=40), "b"),
    ]
    state, _ = get_strategy("fedavg").aggregate(base, updates)
    assert torch.allclose(state["w"], torch.tensor([0.25, 0.75, 0.0]))
    # A claim beyond the job's bound weighs no more than the bound.
    updates[1] = WeightedUpdate(second, processed_samples(10**6, 16, max_steps=40), "b")
    state, _ = get_strategy("fedavg").aggregate(base, updates)
    assert torch.allclose(state["w"], torch.tensor([0.2, 0.8, 0.0]))


# ---------------------------------------------------------------- jobs on one node


def _jobs(chain_s: float, demand: TaskDemand | None = None) -> list[JobWork]:
    demand = demand or TaskDemand("cpu", cores=4)
    return [
        JobWork(
            f"job{k}",
            compute_s=(1.0, 1.0, 1.0),
            download_bytes=100,
            upload_bytes=100,
            chain_s=chain_s,
            demand=demand,
        )
        for k in range(3)
    ]


def _slot() -> list[DeviceSlot]:
    return [DeviceSlot("w", Device("cpu", "cpu", 4))]


def test_overlap_hides_communication_but_never_compute():
    overlap = simulate_node_jobs(_jobs(2.0), _slot(), bandwidth_bytes_per_s=1000.0)
    sequential = simulate_node_jobs(_jobs(2.0), _slot(), bandwidth_bytes_per_s=1000.0, policy="sequential")
    # Sequential: 3 jobs x 3 rounds x (0.1 + 1 + 0.1 + 2) s.
    assert sequential.makespan_s == pytest.approx(28.8)
    assert overlap.makespan_s < 0.6 * sequential.makespan_s
    # One slot, each task demanding all of it: never two computing at once, so the 9 s of
    # compute take at least 9 s of the slot.
    assert overlap.peak_used == {"w/cpu": 4}
    assert overlap.slot_busy_s["w/cpu"] == pytest.approx(9.0)
    assert overlap.makespan_s >= 9.0


def test_without_communication_overlap_gains_nothing():
    overlap = simulate_node_jobs(_jobs(0.0), _slot(), bandwidth_bytes_per_s=1e12)
    sequential = simulate_node_jobs(_jobs(0.0), _slot(), bandwidth_bytes_per_s=1e12, policy="sequential")
    assert overlap.makespan_s == pytest.approx(sequential.makespan_s, rel=1e-6)
    assert overlap.makespan_s == pytest.approx(9.0, rel=1e-6)


def test_concurrent_transfers_share_the_link():
    jobs = [
        JobWork(f"j{k}", compute_s=(0.0,), download_bytes=1000, upload_bytes=0, chain_s=0.0) for k in range(2)
    ]
    run = simulate_node_jobs(jobs, _slot(), bandwidth_bytes_per_s=1000.0)
    assert run.makespan_s == pytest.approx(2.0)  # two 1 s transfers at half the bandwidth each


def test_small_tasks_share_a_device_within_its_capacity():
    jobs = _jobs(0.0, TaskDemand("cpu", cores=2))
    run = simulate_node_jobs(jobs, _slot(), bandwidth_bytes_per_s=1e12)
    assert run.peak_used == {"w/cpu": 4}  # two at once, never three
    assert run.makespan_s == pytest.approx(5.0, rel=1e-6)  # nine 1 s tasks, 2 at a time


def test_jobs_that_fit_nowhere_are_refused():
    with pytest.raises(ValueError, match="fits on no slot"):
        simulate_node_jobs(_jobs(0.0, TaskDemand("cpu", cores=8)), _slot(), bandwidth_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="policy"):
        simulate_node_jobs(_jobs(0.0), _slot(), bandwidth_bytes_per_s=1.0, policy="random")
    with pytest.raises(ValueError):
        JobWork("bad", compute_s=(-1.0,), download_bytes=0, upload_bytes=0, chain_s=0.0)


def test_job_rounds_from_pool_is_seeded():
    pool = [0.01, 0.02, 0.03]
    first = job_rounds_from_pool(pool, steps=10, rounds=5, seed=3)
    assert first == job_rounds_from_pool(pool, steps=10, rounds=5, seed=3)
    assert all(value in (0.1, 0.2, 0.3) or value == pytest.approx(0.3) for value in first)
