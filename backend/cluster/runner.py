"""The TaskRunner: a local task (a round's training) placed on a slot, retried, cancellable, logged.

One ``Task`` row per (job, round, kind). ``enqueue`` creates it (the agent does, when it
dispatches the round's training) with the job's priority; ``run`` executes one attempt on the
worker of this process:

1. wait for its retry time (back-off) and for its turn: among the tasks waiting on this worker,
   the highest priority, then the oldest, takes the next free slot;
2. hold a share of the slot with the most free capacity (``placement``) while it computes,
   on a thread of its own, so jobs share the device: one job's transfers and transactions
   run outside the slot while another job computes on it;
3. keep the attempt's log lines (bounded) and its timings on the row.

A failed attempt re-queues the task with an exponential back-off until ``max_attempts``; each
attempt is a new computation (the trainer reserves its privacy release again, as for any
retrain). Cancelling a queued task ends it at once; a running attempt stops at its next local
step (fl_node.train.step_boundary: the waiting thread sees the request in the database and
sets a flag the training loop checks before every step), is marked cancelled and gives its slot
back; nothing it computed is published. An attempt that ends before it sees the flag has its
output discarded the same way.

Device: the attempt trains on its slot's device (fl_node.train.on_device: "cpu", or "cuda:i"
where torch sees a GPU), holding the demand's share of it (cores, or MB of GPU memory). DP-SGD
trains there too (its secret noise drawn on the CPU and sent over); ``train_demand`` sizes a
run's GPU share from its model, data and settings (fl_node.train.device_memory_mb), so a run
too large for every GPU slot trains on a CPU slot.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from datetime import timedelta
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from backend.cluster import placement, registry
from backend.cluster import priority as thread_priority
from backend.cluster.errors import ActionError
from backend.cluster.models import ERROR_LIMIT, LOG_LIMIT, DeviceSlot, JobQueue, Task, Worker
from fl_node import train as fl_train
from fl_node.data import ArrayDataset
from fl_node.scheduler import TaskDemand

logger = logging.getLogger(__name__)
T = TypeVar("T")
State = Task.State

# Local training holds one core of a CPU slot, or this much memory of a GPU slot where a worker
# declares one (fl_node.scheduler.place: GPUs first for "auto"); it trains on that device.
# The default, for a task routed before its model is known; train_demand sizes a known run.
TRAIN_GPU_MEMORY_MB = 2048
TRAIN_DEMAND = TaskDemand(kind="auto", cores=1, gpu_memory_mb=TRAIN_GPU_MEMORY_MB)
CANCEL_POLL_S = 0.1  # a running attempt's cancel request is looked for this often
MAX_ATTEMPTS = 3
RETRY_BASE_S = 2.0
RETRY_CAP_S = 300.0
QUEUE_WAIT_S = 3600.0  # an attempt waits at most this long for a slot, then its action retries
POLL_S = 0.2
ALIVE_POLL_S = 10.0  # a waiting runner marks its task this often at least (every POLL_S * 10)
DB_WAIT_S = 120.0  # an attempt's end waits this long for a restarting database to record it


class TaskCancelled(ActionError):
    """The operator cancelled the task: nothing it computed leaves the node."""


class TaskGaveUp(ActionError):
    """Every attempt failed: the task stays failed until an operator resets it."""


class _Stopped(BaseException):
    """Raised inside the training loop at a step boundary once the task's cancel was requested.

    A BaseException, so that no ``except Exception`` of the code in between swallows it.
    """


def _in_slot(fn: Callable[..., T], device: str, stop: threading.Event) -> Callable[..., T]:
    """``fn`` on the slot's device, stopping at the next step once ``stop`` is set."""

    def check(step: int) -> None:
        if stop.is_set():
            raise _Stopped(f"stopped before local step {step + 1}")

    def call(*args, **kwargs):
        with fl_train.on_device(device), fl_train.step_boundary(check):
            return fn(*args, **kwargs)

    return call


def train_demand(model, data: ArrayDataset, config: fl_train.TrainConfig) -> TaskDemand:
    """One core of a CPU slot, or the run's estimated memory of a GPU slot (plain or DP-SGD).

    ``TRAIN_DEMAND`` when the model gives no estimate. A run estimated larger than every
    GPU slot is placed on a CPU slot ("auto": GPUs first, where the demand fits).
    """
    memory_mb = fl_train.device_memory_mb(model, data, config)
    if memory_mb is None:
        return TRAIN_DEMAND
    return TaskDemand(kind="auto", cores=1, gpu_memory_mb=memory_mb)


def _drop_closed_connection() -> None:
    """Close this thread's connection if the server closed it (or it expired): the next query
    opens a new one. Never inside a transaction, which closing would abort."""
    if not connection.in_atomic_block:
        close_old_connections()


def _wait(future: Future, task: Task, stop: threading.Event):
    """The attempt's result; meanwhile, a cancel request in the database sets ``stop``."""
    while not wait([future], timeout=CANCEL_POLL_S).done:
        try:
            if not stop.is_set() and Task.objects.filter(pk=task.pk, cancel_requested=True).exists():
                stop.set()
        except DatabaseError:  # the server restarts: the attempt goes on, asked again next poll
            _drop_closed_connection()  # replaced at the next poll
    _await_database()
    return future.result()


def _await_database(within_s: float = DB_WAIT_S) -> None:
    """Wait until this thread's database answers (a restarting server refuses connections for
    seconds), so that what the attempt computed (its privacy spent) is recorded, not lost to a
    failed write and computed again. After ``within_s`` the writes that follow fail and say why."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return
        except DatabaseError:
            _drop_closed_connection()
            if time.monotonic() > deadline:
                return
            time.sleep(0.5)


def _setting(name: str, default):
    return type(default)(getattr(settings, name, default))


def backoff_s(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: base * 2^(attempts - 1), capped."""
    base = _setting("DEFL_CLUSTER_RETRY_BASE_S", RETRY_BASE_S)
    return min(base * 2 ** max(attempts - 1, 0), RETRY_CAP_S)


def job_priority(job_id: int) -> int:
    row = JobQueue.objects.filter(job_id=job_id).first()
    return row.priority if row is not None else 0


def enqueue(job_id: int, round_: int, kind: str = Task.Kind.TRAIN, *, node: str = "") -> Task:
    """The task of (job, round, kind) of ``node``, created queued with the job's priority if new."""
    task = Task.objects.filter(node=node, job_id=job_id, round=round_, kind=kind).first()
    if task is not None:
        return task
    try:
        with transaction.atomic():
            return Task.objects.create(
                node=node,
                job_id=job_id,
                round=round_,
                kind=kind,
                priority=job_priority(job_id),
                max_attempts=_setting("DEFL_CLUSTER_MAX_ATTEMPTS", MAX_ATTEMPTS),
            )
    except IntegrityError:  # created by another process at the same moment
        return Task.objects.get(node=node, job_id=job_id, round=round_, kind=kind)


def closed(job_id: int, round_: int, kind: str = Task.Kind.TRAIN, *, node: str = "") -> Task | None:
    """The task when it must not run again (cancelled, or out of attempts); else None."""
    return (
        Task.objects.filter(node=node, job_id=job_id, round=round_, kind=kind)
        .filter(Q(state=State.CANCELLED) | Q(state=State.FAILED))
        .first()
    )


def append_log(task: Task, text: str) -> None:
    """Append to the task's log, keeping its last ``LOG_LIMIT`` characters."""
    fresh = Task.objects.filter(pk=task.pk).values_list("log", flat=True).first() or ""
    task.log = (fresh + text)[-LOG_LIMIT:]
    Task.objects.filter(pk=task.pk).update(log=task.log)


def _line(message: str) -> str:
    return f"{timezone.now().isoformat(timespec='milliseconds')} {message}\n"


def route(task: Task, demand: TaskDemand = TRAIN_DEMAND) -> Worker | None:
    """With several workers: place ``task`` now on the best slot of any live worker and return
    that worker (its queue gets the task); None when no slot has room (any worker takes it)."""
    placement.release(task)
    slot = placement.reserve(task, demand)
    if slot is None:
        return None
    append_log(task, _line(f"placed on {slot.worker.name} {slot.device_name}"))
    return slot.worker


# ------------------------------------------------------------------ running one attempt

_lanes_lock = threading.Lock()
_busy_lanes: dict[int, set[int]] = {}


def _take_lane(slot_id: int) -> int:
    with _lanes_lock:
        busy = _busy_lanes.setdefault(slot_id, set())
        lane = next(i for i in range(len(busy) + 1) if i not in busy)
        busy.add(lane)
        return lane


def _free_lane(slot_id: int, lane: int) -> None:
    with _lanes_lock:
        _busy_lanes.get(slot_id, set()).discard(lane)


class _ThreadLog(logging.Handler):
    """Collects the records logged by one thread (the attempt's), formatted, in memory."""

    def __init__(self, thread_id: int) -> None:
        super().__init__(logging.INFO)
        self.thread_id = thread_id
        self.lines: list[str] = []
        self.size = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread_id or self.size > LOG_LIMIT:
            return
        line = self.format(record)[:2000] + "\n"
        self.lines.append(line)
        self.size += len(line)


def _logged(fn: Callable[..., T], handlers: list[_ThreadLog]) -> Callable[..., T]:
    def call(*args, **kwargs):
        handler = _ThreadLog(threading.get_ident())
        handlers.append(handler)
        logging.getLogger().addHandler(handler)
        # The pool thread keeps its database connection between tasks: one the server closed
        # meanwhile (restarted) is dropped here, not used by the task and failed on.
        _drop_closed_connection()
        try:
            return fn(*args, **kwargs)
        finally:
            logging.getLogger().removeHandler(handler)

    return call


def _my_turn(task: Task, worker: Worker) -> bool:
    """No task waiting on this worker comes before ``task`` (higher priority, or older)."""
    now = timezone.now()
    # Only tasks whose runner is waiting right now (it polled lately) count: one whose process
    # died, or that sits out its back-off, blocks no one.
    ahead = Task.objects.filter(
        state=State.QUEUED, worker=worker, amount=0, polled_at__gte=now - timedelta(seconds=ALIVE_POLL_S)
    ).filter(Q(priority__gt=task.priority) | Q(priority=task.priority, created__lt=task.created))
    ahead = ahead.exclude(next_retry_at__gt=now)
    return not ahead.exclude(pk=task.pk).exists()


def _acquire(task: Task, worker: Worker, demand: TaskDemand) -> DeviceSlot:
    """Wait for the retry time and a slot of ``worker``, and return it; raises TaskCancelled."""
    deadline = time.monotonic() + _setting("DEFL_CLUSTER_QUEUE_WAIT_S", QUEUE_WAIT_S)
    if task.amount and task.worker_id != worker.pk:
        placement.release(task)  # routed elsewhere earlier: this worker runs it now
        task.slot = None
    Task.objects.filter(pk=task.pk).update(worker=worker)
    task.worker = worker
    polls = 0
    while True:
        if polls % 10 == 0:
            Task.objects.filter(pk=task.pk).update(polled_at=timezone.now())
        polls += 1
        task.refresh_from_db(
            fields=["state", "cancel_requested", "priority", "next_retry_at", "slot", "amount"]
        )
        if task.state == State.CANCELLED or task.cancel_requested:
            placement.release(task)
            _cancel(task)
            raise TaskCancelled(f"task {task.pk} was cancelled")
        if task.amount and (routed := task.slot) is not None:
            if task.amount >= demand.amount_for(routed.kind):
                return routed  # placed (its share held) when it was routed to this worker
            placement.release(task)  # routed with a smaller share than this run needs: place it again
        waiting = task.next_retry_at is not None and task.next_retry_at > timezone.now()
        if not waiting and _my_turn(task, worker):
            placed = placement.reserve(task, demand, [worker.pk])
            if placed is not None:
                return placed
        if time.monotonic() > deadline:
            raise ActionError(f"no slot of {worker.name} was free for task {task.pk}")
        time.sleep(POLL_S)


def _cancel(task: Task) -> None:
    Task.objects.filter(pk=task.pk).exclude(state=State.CANCELLED).update(
        state=State.CANCELLED, finished_at=timezone.now(), next_retry_at=None
    )
    task.state = State.CANCELLED


def run(
    job_id: int,
    round_: int,
    fn: Callable[..., T],
    *args,
    kind: str = Task.Kind.TRAIN,
    node: str = "",
    demand: TaskDemand = TRAIN_DEMAND,
    nice: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    **kwargs,
) -> T:
    """One attempt of the task of (job, round, kind): ``fn(*args, **kwargs)`` on a slot of this worker.

    Raises TaskCancelled, TaskGaveUp, or the attempt's own exception (the task is then queued
    again with its back-off, or failed for good after its last attempt). ``clock`` times the
    attempt (its ``duration_s``, which adaptive local work reads as the round's step time); a
    test passes one it advances itself.
    """
    task = enqueue(job_id, round_, kind, node=node)
    if task.state == State.CANCELLED or task.cancel_requested:
        _cancel(task)
        raise TaskCancelled(f"task {task.pk} was cancelled")
    if task.state == State.FAILED:
        raise TaskGaveUp(f"task {task.pk} failed {task.attempts} times: {task.error}")
    if task.state == State.SUCCEEDED:
        # A second computation of the round (its first update was discarded unpublished).
        Task.objects.filter(pk=task.pk).update(state=State.QUEUED, attempts=0, error="")
        append_log(task, _line("training again: the round opened on another model"))
    elif task.state == State.RUNNING:
        placement.release(task)  # a lost attempt (its process died): run it here
        Task.objects.filter(pk=task.pk).update(state=State.QUEUED, slot=None)
    task.refresh_from_db()
    worker = registry.current()
    queued_since = timezone.now()
    slot = _acquire(task, worker, demand)
    started = timezone.now()
    attempt = task.attempts + 1
    Task.objects.filter(pk=task.pk).update(
        state=State.RUNNING,
        attempts=attempt,
        started_at=started,
        finished_at=None,
        duration_s=None,
        next_retry_at=None,
        polled_at=None,
        wait_s=(started - queued_since).total_seconds(),
    )
    append_log(task, _line(f"attempt {attempt}/{task.max_attempts} on {worker.name} {slot.device_name}"))
    lane = _take_lane(slot.pk)
    handlers: list[_ThreadLog] = []
    stop = threading.Event()
    began = clock()
    try:
        executor = thread_priority.low_priority(f"task-{slot.device_name}-{lane}", nice)
        # The training thread logs under the action's job, round and kind (contextvars are per thread).
        context = contextvars.copy_context()
        future = executor.submit(
            context.run, _logged(_in_slot(fn, slot.device_name, stop), handlers), *args, **kwargs
        )
        result = _wait(future, task, stop)
    except _Stopped as exc:
        seconds = clock() - began
        captured = "".join(line for h in handlers for line in h.lines)
        append_log(task, captured + _line(f"cancelled while running: {exc} after {seconds:.3f} s"))
        Task.objects.filter(pk=task.pk).update(duration_s=seconds)
        _cancel(task)
        raise TaskCancelled(f"task {task.pk} was cancelled while it ran ({exc})") from None
    except BaseException as exc:
        _failed(task, attempt, clock() - began, exc, handlers)
        raise
    finally:
        _free_lane(slot.pk, lane)
        placement.release(task)
    seconds = clock() - began
    captured = "".join(line for h in handlers for line in h.lines)
    task.refresh_from_db(fields=["cancel_requested", "log"])
    if task.cancel_requested:
        append_log(
            task, captured + _line(f"cancelled while running: its output ({seconds:.3f} s) is discarded")
        )
        Task.objects.filter(pk=task.pk).update(duration_s=seconds)
        _cancel(task)
        raise TaskCancelled(f"task {task.pk} was cancelled while it ran")
    append_log(task, captured + _line(f"succeeded in {seconds:.3f} s"))
    Task.objects.filter(pk=task.pk).update(
        state=State.SUCCEEDED, finished_at=timezone.now(), duration_s=seconds, error=""
    )
    return result


def _failed(task: Task, attempt: int, seconds: float, exc: BaseException, handlers: list[_ThreadLog]) -> None:
    error = f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT]
    captured = "".join(line for h in handlers for line in h.lines)
    now = timezone.now()
    if attempt >= task.max_attempts:
        append_log(task, captured + _line(f"attempt {attempt} failed: {error}; giving up"))
        Task.objects.filter(pk=task.pk).update(
            state=State.FAILED, finished_at=now, duration_s=seconds, error=error, next_retry_at=None
        )
        return
    delay = backoff_s(attempt)
    append_log(task, captured + _line(f"attempt {attempt} failed: {error}; retry in {delay:.1f} s"))
    Task.objects.filter(pk=task.pk).update(
        state=State.QUEUED,
        finished_at=now,
        duration_s=seconds,
        error=error,
        next_retry_at=now + timedelta(seconds=delay),
        slot=None,
    )


# ------------------------------------------------------------------ operator actions


class NotCancellable(Exception):
    pass


def cancel(task: Task) -> Task:
    """Cancel a queued task at once; ask a running one to stop at its next step (its output discarded)."""
    now = timezone.now()
    if Task.objects.filter(pk=task.pk, state=State.QUEUED).update(
        state=State.CANCELLED, cancel_requested=True, finished_at=now, next_retry_at=None
    ):
        placement.release(task)  # a routed task may hold a share of a slot already
        append_log(task, _line("cancelled by the operator while queued"))
    elif Task.objects.filter(pk=task.pk, state=State.RUNNING).update(cancel_requested=True):
        append_log(task, _line("cancel requested: the running attempt stops at its next step"))
    else:
        task.refresh_from_db()
        raise NotCancellable(f"task {task.pk} is {task.state}: only queued or running tasks can be cancelled")
    task.refresh_from_db()
    return task


def set_priority(job_id: int, value: int) -> int:
    """The job's priority from now on, applied to its queued tasks too; returns how many changed."""
    JobQueue.objects.update_or_create(job_id=job_id, defaults={"priority": value})
    return Task.objects.filter(job_id=job_id, state__in=Task.OPEN).update(priority=value)


def queue_positions() -> dict[int, int]:
    """Task id -> 1-based place in this node's queue (queued tasks only, the runner's order)."""
    ids = (
        Task.objects.filter(state=State.QUEUED)
        .order_by("-priority", "created", "pk")
        .values_list("pk", flat=True)
    )
    return {pk: i + 1 for i, pk in enumerate(ids[:10_000])}
