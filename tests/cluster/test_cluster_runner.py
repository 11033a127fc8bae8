"""The TaskRunner on the real database: greedy placement, retries with back-off, cancel, logs, priority."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from backend.cluster import placement, registry, runner
from backend.cluster.models import DeviceSlot, Task, Worker
from fl_node.scheduler import TaskDemand

pytestmark = pytest.mark.django_db(transaction=True)
ONE_CORE = TaskDemand(kind="cpu", cores=1)


def _worker(settings, name: str, cores: int) -> Worker:
    settings.DEFL_CLUSTER_CPU_CORES = cores
    return registry.register(name, queue=name)


def _cpu(worker: Worker) -> DeviceSlot:
    return worker.slots.get(kind=DeviceSlot.Kind.CPU)


def test_local_process_registers_as_one_worker_with_its_cores(settings):
    import os

    settings.DEFL_CLUSTER_CPU_CORES = 0
    worker = registry.ensure_local()
    assert worker.name == registry.local_name()
    assert worker.queue == ""  # the in-process runner: no broker queue
    slot = _cpu(worker)
    assert slot.capacity == len(os.sched_getaffinity(0))
    assert (slot.used, slot.running) == (0, 0)
    assert registry.ensure_local().pk == worker.pk  # once per process


def test_greedy_placement_takes_the_slot_with_most_free_capacity(settings):
    small, big = _worker(settings, "w1@a", 2), _worker(settings, "w2@b", 4)
    tasks = [runner.enqueue(7, r) for r in range(1, 8)]
    placed = [placement.reserve(task, ONE_CORE) for task in tasks[:6]]
    # Equal free fractions: the most free cores wins; 4 of 4 over 2 of 2, then 1.0 of w1 over 0.75.
    assert [slot.worker.name for slot in placed] == ["w2@b", "w1@a", "w2@b", "w2@b", "w1@a", "w2@b"]
    assert (_cpu(small).used, _cpu(big).used) == (2, 4)
    assert placement.reserve(tasks[6], ONE_CORE) is None  # full: it waits in the queue
    placement.release(tasks[0])
    assert _cpu(big).used == 3
    assert placement.reserve(tasks[6], ONE_CORE).worker.name == "w2@b"
    placement.release(tasks[0])  # a second release gives back nothing more
    assert _cpu(big).used == 4


def test_a_silent_worker_gets_no_task(settings):
    worker = _worker(settings, "w1@a", 2)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=120))
    assert placement.reserve(runner.enqueue(7, 1), ONE_CORE) is None
    registry.beat("w1@a")
    assert placement.reserve(runner.enqueue(7, 1), ONE_CORE) is not None


def test_a_run_records_placement_logs_and_timings(settings):
    settings.DEFL_CLUSTER_CPU_CORES = 2

    def work(x):
        logging.getLogger("fl_node.train").warning("epoch 1 of job %s", x)
        return x * 2

    assert runner.run(11, 3, work, 21) == 42
    task = Task.objects.get(job_id=11, round=3)
    assert task.state == Task.State.SUCCEEDED and task.attempts == 1
    assert task.worker.name == registry.local_name() and task.slot.kind == "cpu"
    assert "epoch 1 of job 21" in task.log and "succeeded in" in task.log
    assert task.duration_s is not None and task.duration_s >= 0 and task.finished_at >= task.started_at
    assert (_cpu(task.worker).used, _cpu(task.worker).running) == (0, 0)  # its share given back


def test_failed_attempts_back_off_then_succeed(settings):
    settings.DEFL_CLUSTER_RETRY_BASE_S = 0.5
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("worker lost its dataset cache")
        return "ok"

    with pytest.raises(RuntimeError):
        runner.run(12, 1, flaky)
    task = Task.objects.get(job_id=12, round=1)
    assert task.state == Task.State.QUEUED and task.attempts == 1
    assert "RuntimeError: worker lost its dataset cache" in task.error
    assert task.next_retry_at is not None
    assert runner.run(12, 1, flaky) == "ok"  # waits out the back-off first
    assert calls[1] - calls[0] >= 0.5 - 0.05
    task.refresh_from_db()
    assert task.state == Task.State.SUCCEEDED and task.attempts == 2
    assert "retry in 0.5 s" in task.log
    assert runner.backoff_s(1) == 0.5 and runner.backoff_s(3) == 2.0
    assert runner.backoff_s(50) == runner.RETRY_CAP_S


def test_gives_up_after_the_last_attempt_and_closes_the_task(settings):
    settings.DEFL_CLUSTER_MAX_ATTEMPTS = 2
    settings.DEFL_CLUSTER_RETRY_BASE_S = 0.01

    def broken():
        raise ValueError("bad shapes")

    for _ in range(2):
        with pytest.raises(ValueError):
            runner.run(13, 1, broken)
    task = Task.objects.get(job_id=13, round=1)
    assert task.state == Task.State.FAILED and task.attempts == 2 and "giving up" in task.log
    assert runner.closed(13, 1) == task
    with pytest.raises(runner.TaskGaveUp):
        runner.run(13, 1, broken)


def test_cancel_a_queued_task_runs_nothing(settings):
    task = runner.enqueue(14, 1)
    runner.cancel(task)
    ran = []
    with pytest.raises(runner.TaskCancelled):
        runner.run(14, 1, ran.append, 1)
    assert ran == []
    task.refresh_from_db()
    assert task.state == Task.State.CANCELLED and runner.closed(14, 1) == task
    with pytest.raises(runner.NotCancellable):
        runner.cancel(task)


def test_cancel_while_running_discards_the_output(settings):
    def work():
        # The operator's cancel arrives while the attempt computes (another connection).
        runner.cancel(Task.objects.get(job_id=15, round=1))
        return "an update that must not leave the node"

    with pytest.raises(runner.TaskCancelled):
        runner.run(15, 1, work)
    task = Task.objects.get(job_id=15, round=1)
    assert task.state == Task.State.CANCELLED and "output" in task.log and "discarded" in task.log
    assert _cpu(registry.ensure_local()).used == 0


def test_priority_orders_the_queue_and_the_turns(settings):
    worker = _worker(settings, "w1@a", 1)
    low, high = runner.enqueue(20, 1), runner.enqueue(21, 1)
    now = timezone.now()
    Task.objects.filter(pk__in=[low.pk, high.pk]).update(worker=worker, polled_at=now)
    low.refresh_from_db()
    high.refresh_from_db()
    assert runner.queue_positions() == {low.pk: 1, high.pk: 2}  # same priority: first come
    assert runner._my_turn(low, worker) and not runner._my_turn(high, worker)
    assert runner.set_priority(21, 5) == 1
    high.refresh_from_db()
    assert high.priority == 5 and runner.queue_positions() == {high.pk: 1, low.pk: 2}
    assert runner._my_turn(high, worker) and not runner._my_turn(low, worker)
    assert runner.enqueue(21, 2).priority == 5  # the job's later tasks too
    # A waiter whose process died (no poll for long) blocks no one.
    Task.objects.filter(pk=high.pk).update(polled_at=now - timedelta(seconds=60))
    assert runner._my_turn(low, worker)


def test_log_is_bounded(settings):
    from backend.cluster.models import LOG_LIMIT

    def chatty():
        for i in range(5000):
            logging.getLogger("fl_node").warning("line %05d %s", i, "x" * 40)

    runner.run(16, 1, chatty)
    task = Task.objects.get(job_id=16, round=1)
    assert len(task.log) <= LOG_LIMIT and task.log.endswith("s\n")


def test_gpu_slots_account_memory_and_auto_demands_fall_back_to_the_cpu(settings):
    """A GPU slot's capacity is its memory (MB): tasks hold what they declared until it is full.
    (The slot row is made by hand: the test machine may have no GPU.)"""
    worker = _worker(settings, "gpu@box", 2)
    gpu = DeviceSlot.objects.create(
        worker=worker, kind=DeviceSlot.Kind.CUDA, index=0, name="H100", capacity=10_000
    )
    demand = TaskDemand(kind="auto", cores=1, gpu_memory_mb=4_000)
    tasks = [runner.enqueue(50, r) for r in range(1, 5)]
    kinds = [placement.reserve(task, demand).kind for task in tasks]
    assert kinds == ["cuda", "cuda", "cpu", "cpu"]  # 2 x 4000 MB fit in 10000; then the CPU
    gpu.refresh_from_db()
    assert (gpu.used, gpu.running, gpu.free, round(gpu.load, 2)) == (8_000, 2, 2_000, 0.8)
    placement.release(tasks[0])
    gpu.refresh_from_db()
    assert gpu.used == 4_000
    assert placement.reserve(runner.enqueue(50, 9), TaskDemand(kind="cuda", gpu_memory_mb=6_001)) is None


def _tiny_training():
    import numpy as np

    from fl_node.data import ArrayDataset
    from fl_node.models import create_model

    rng = np.random.default_rng(0)
    data = ArrayDataset(
        rng.normal(size=(64, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int64)
    )
    model = create_model("mlp", input_shape=(1, 8, 8), num_classes=3, seed=0)
    return model, {k: v.clone() for k, v in model.state_dict().items()}, data


def test_cancel_stops_a_running_training_at_its_next_step(settings):
    """The operator's cancel (another connection) stops the training loop between two steps: the
    attempt does not run its remaining steps, is cancelled (not retried) and frees its slot."""
    import threading

    from fl_node.train import TrainConfig, step_boundary, train_local

    model, state, data = _tiny_training()
    steps: list[int] = []
    total = 200_000  # far more than the test waits for: only the cancel can end it in time

    def work():
        with step_boundary(steps.append):
            return train_local(model, state, data, TrainConfig(local_steps=total, batch_size=16))

    def operator():
        deadline = time.monotonic() + 30
        while len(steps) < 5 and time.monotonic() < deadline:  # the training is under way
            time.sleep(0.01)
        runner.cancel(Task.objects.get(job_id=17, round=1))

    thread = threading.Thread(target=operator)
    thread.start()
    started = time.monotonic()
    with pytest.raises(runner.TaskCancelled):
        runner.run(17, 1, work)
    thread.join()
    assert 5 <= len(steps) < total and time.monotonic() - started < 30
    task = Task.objects.get(job_id=17, round=1)
    assert task.state == Task.State.CANCELLED and task.attempts == 1 and task.next_retry_at is None
    assert "stopped before local step" in task.log and "cancelled while running" in task.log
    slot = _cpu(registry.ensure_local())
    assert (slot.used, slot.running) == (0, 0)
    with pytest.raises(runner.TaskCancelled):  # the action's retry runs nothing
        runner.run(17, 1, work)


def test_a_task_trains_on_its_slots_device(settings):
    """The slot's device reaches the training: "cpu" on a CPU slot; "cuda:0" on a GPU slot (made
    by hand: the machine may have none), where training falls back to the CPU if torch sees none."""
    import torch

    from fl_node.train import _DEVICE, resolve_device

    def device_seen():
        held = DeviceSlot.objects.filter(kind=DeviceSlot.Kind.CUDA).values_list("used", flat=True).first()
        return _DEVICE.get(), resolve_device().type, held

    assert runner.run(18, 1, device_seen) == ("cpu", "cpu", None)
    worker = registry.ensure_local()
    gpu = DeviceSlot.objects.create(
        worker=worker, kind=DeviceSlot.Kind.CUDA, index=0, name="GPU", capacity=10_000
    )
    seen = runner.run(18, 2, device_seen)
    # While it ran it held the training demand's GPU memory of the slot.
    assert seen == ("cuda:0", "cuda" if torch.cuda.is_available() else "cpu", runner.TRAIN_GPU_MEMORY_MB)
    task = Task.objects.get(job_id=18, round=2)
    assert task.slot_id == gpu.pk and "cuda:0" in task.log
    gpu.refresh_from_db()
    assert (gpu.used, gpu.running) == (0, 0)  # its memory share was held while it ran, then freed


def test_dp_training_holds_its_estimated_gpu_memory(settings):
    """DP-SGD trains on a GPU slot (no longer forced to the CPU) holding the run's estimated memory:
    a slot with exactly that much takes it, one MB less sends it to the CPU slot, and a task routed
    with a smaller share is placed again with the run's. (The GPU slot is made by hand: where
    torch sees no GPU the run trains on the CPU.)"""
    from fl_node.train import _DEVICE, TrainConfig, device_memory_mb, train_local

    model, state, data = _tiny_training()
    config = TrainConfig(local_steps=2, batch_size=16, noise_multiplier=1.0)
    estimate = device_memory_mb(model, data, config)
    demand = runner.train_demand(model, data, config)
    assert (demand.kind, demand.cores, demand.gpu_memory_mb) == ("auto", 1, estimate)
    worker = registry.ensure_local()
    gpu = DeviceSlot.objects.create(
        worker=worker, kind=DeviceSlot.Kind.CUDA, index=0, name="GPU", capacity=estimate
    )

    def train():
        held = DeviceSlot.objects.get(pk=gpu.pk).used
        return _DEVICE.get(), held, train_local(model, state, data, config)

    device, held, result = runner.run(19, 1, train, demand=demand)
    assert (device, held, result.privacy.steps) == ("cuda:0", estimate, 2)
    too_big = TaskDemand(kind="auto", cores=1, gpu_memory_mb=estimate + 1)
    assert runner.run(19, 2, train, demand=too_big)[:2] == ("cpu", 0)
    routed = runner.enqueue(19, 3)
    assert runner.route(routed, TaskDemand(kind="auto", cores=1, gpu_memory_mb=1)) is not None
    assert Task.objects.get(pk=routed.pk).amount == 1
    assert runner.run(19, 3, train, demand=demand)[:2] == ("cuda:0", estimate)
    gpu.refresh_from_db()
    assert (gpu.used, gpu.running) == (0, 0)
