"""Greedy placement of a task on a device slot, with the slot's capacity reserved atomically.

The choice is ``fl_node.scheduler.place`` (the slot with the most free capacity, GPUs first for
"auto" demands) over the database's view of the slots; the reservation is one conditional
UPDATE, so two processes placing at once can never overfill a slot: the loser places again.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import F

from backend.cluster import registry
from backend.cluster.models import DeviceSlot, Task
from fl_node import scheduler

RACE_RETRIES = 8


def _as_scheduler_slot(row: DeviceSlot) -> scheduler.DeviceSlot:
    device = scheduler.Device(row.device_name, row.kind, max(1, row.capacity), row.name)
    slot = scheduler.DeviceSlot(row.worker.name, device)
    if row.used:
        slot.tasks["held"] = min(row.used, row.capacity)
    return slot


def choose(demand: scheduler.TaskDemand, rows: Iterable[DeviceSlot]) -> DeviceSlot | None:
    """The row ``fl_node.scheduler.place`` picks among ``rows`` (nothing reserved)."""
    rows = list(rows)
    by_key = {(row.worker.name, row.device_name): row for row in rows}
    chosen = scheduler.place(demand, [_as_scheduler_slot(row) for row in rows])
    return None if chosen is None else by_key[chosen.key]


def live_slots(worker_ids: Iterable[int] | None = None):
    rows = DeviceSlot.objects.select_related("worker").filter(worker__in=registry.live_workers())
    if worker_ids is not None:
        rows = rows.filter(worker_id__in=list(worker_ids))
    return rows


def reserve(
    task: Task, demand: scheduler.TaskDemand, worker_ids: Iterable[int] | None = None
) -> DeviceSlot | None:
    """Place ``task`` on the best live slot (of ``worker_ids`` only, when given) and hold its share.

    None when no slot has room now: the task waits in the queue.
    """
    worker_ids = None if worker_ids is None else list(worker_ids)
    for _ in range(RACE_RETRIES):
        row = choose(demand, live_slots(worker_ids))
        if row is None:
            return None
        amount = demand.amount_for(row.kind)
        taken = DeviceSlot.objects.filter(pk=row.pk, used__lte=F("capacity") - amount).update(
            used=F("used") + amount, running=F("running") + 1
        )
        if taken:
            Task.objects.filter(pk=task.pk).update(slot=row, worker=row.worker, amount=amount)
            task.slot, task.worker, task.amount = row, row.worker, amount
            return row
    return None


def release(task: Task) -> None:
    """Give back what ``task`` holds (no-op when it holds nothing)."""
    if task.slot_id is None or not task.amount:
        return
    DeviceSlot.objects.filter(pk=task.slot_id, used__gte=task.amount, running__gte=1).update(
        used=F("used") - task.amount, running=F("running") - 1
    )
    Task.objects.filter(pk=task.pk).update(amount=0)
    task.amount = 0


def best_worker(demand: scheduler.TaskDemand):
    """The live worker whose slot has the most free capacity now (for routing), or None."""
    row = choose(demand, live_slots())
    return None if row is None else row.worker
