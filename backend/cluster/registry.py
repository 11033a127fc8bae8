"""Workers declare their devices as slots and heartbeat; placement only uses workers that do.

A Celery worker registers at ``worker_ready`` under its node name (``w2@host``) with its direct
queue; without a broker the node's own process registers as ``local@host`` the first time it
runs a task (the in-process runner). Devices come from ``fl_node.scheduler.discover_devices``
(torch: CPU cores, every GPU with its memory).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from backend.cluster.models import DeviceSlot, Task, Worker
from fl_node.scheduler import Device, discover_devices

logger = logging.getLogger(__name__)
HEARTBEAT_S = 10.0
# A worker silent this long is offline: it gets no new task (its slots stay listed, greyed out).
WORKER_TIMEOUT_S = 60.0
MAX_CPU_CORES = 4096  # bound on an operator's override: a typo must not make a worker look infinite


def heartbeat_s() -> float:
    return float(getattr(settings, "DEFL_CLUSTER_HEARTBEAT_S", HEARTBEAT_S))


def worker_timeout_s() -> float:
    return float(getattr(settings, "DEFL_CLUSTER_WORKER_TIMEOUT_S", WORKER_TIMEOUT_S))


def local_name() -> str:
    return f"local@{socket.gethostname()}"


def devices() -> list[Device]:
    """This machine's devices; ``DEFL_CLUSTER_CPU_CORES`` (>0) overrides the cores it lends to tasks."""
    found = discover_devices(include_gpu=bool(getattr(settings, "DEFL_CLUSTER_USE_GPU", True)))
    cores = int(getattr(settings, "DEFL_CLUSTER_CPU_CORES", 0) or 0)
    if cores > 0:
        found = [
            Device("cpu", "cpu", min(cores, MAX_CPU_CORES), "cpu") if d.kind == "cpu" else d for d in found
        ]
    return found


def register(name: str, *, queue: str = "", host: str | None = None) -> Worker:
    """(Re)declare worker ``name`` with this machine's devices.

    A worker that starts again has nothing running any more: its slots are emptied and the
    tasks it was running go back to the queue (their attempt counted).
    """
    now = timezone.now()
    found = devices()
    with transaction.atomic():
        worker, _ = Worker.objects.update_or_create(
            name=name[:200],
            defaults={
                "host": (host or socket.gethostname())[:200],
                "pid": os.getpid(),
                "queue": queue[:255],
                "state": Worker.State.ONLINE,
                "started": now,
                "last_heartbeat": now,
            },
        )
        Task.objects.filter(worker=worker, state=Task.State.RUNNING).update(
            state=Task.State.QUEUED, slot=None, error="its worker restarted"
        )
        kept = []
        for device in found:
            kind = DeviceSlot.Kind.CPU if device.kind == "cpu" else DeviceSlot.Kind.CUDA
            index = 0 if kind == DeviceSlot.Kind.CPU else int(device.name.split(":")[1])
            slot, _ = DeviceSlot.objects.update_or_create(
                worker=worker,
                kind=kind,
                index=index,
                defaults={"name": device.label[:200], "capacity": device.capacity, "used": 0, "running": 0},
            )
            kept.append(slot.pk)
        worker.slots.exclude(pk__in=kept).delete()
    logger.info("worker %s registered: %s", worker.name, ", ".join(f"{d.name}={d.capacity}" for d in found))
    return worker


def beat(name: str) -> bool:
    return bool(
        Worker.objects.filter(name=name).update(last_heartbeat=timezone.now(), state=Worker.State.ONLINE)
    )


def stopped(name: str) -> None:
    Worker.objects.filter(name=name).update(state=Worker.State.STOPPED)


def live_workers():
    cutoff = timezone.now() - timedelta(seconds=worker_timeout_s())
    return Worker.objects.filter(state=Worker.State.ONLINE, last_heartbeat__gte=cutoff)


def is_live(worker: Worker) -> bool:
    return (
        worker.state == Worker.State.ONLINE
        and (timezone.now() - worker.last_heartbeat).total_seconds() <= worker_timeout_s()
    )


class Heartbeat:
    """A daemon thread that keeps ``name``'s heartbeat fresh until ``stop``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(heartbeat_s()):
            try:
                if not beat(self.name):  # removed behind its back (a fresh database): declare again
                    register(self.name)
            except Exception:  # the database went away for a moment: the next beat tries again
                logger.warning("heartbeat of %s failed", self.name, exc_info=True)
            finally:
                _close_connections_quietly()


def _close_connections_quietly() -> None:
    """Drop this thread's dead connections; a failure to (the database refusing this thread,
    as a test's database guard does once its test ended) leaves nothing to close, not a crash."""
    try:
        close_old_connections()
    except Exception as exc:
        logger.debug("closing the heartbeat's connections: %s", exc)


_local_lock = threading.Lock()
_local: dict[str, Heartbeat] = {}


def ensure_local() -> Worker:
    """The in-process runner's worker (no broker): registered once per process, then heartbeating."""
    name = local_name()
    with _local_lock:
        if name not in _local:
            registered = register(name)
            _local[name] = Heartbeat(name).start()
            return registered
    worker = Worker.objects.filter(name=name).first()
    return worker if worker is not None else register(name)


_current: dict[str, str] = {}


def set_current(name: str) -> None:
    """This process is Celery worker ``name``: tasks it runs are placed on its slots."""
    _current["name"] = name


def current() -> Worker:
    """The worker this process is: the Celery worker it runs as, else the in-process runner."""
    name = _celery_hostname() or _current.get("name")
    if name:
        worker = Worker.objects.filter(name=name).first()
        return worker if worker is not None else register(name)
    return ensure_local()


def _celery_hostname() -> str | None:
    """The node name of the Celery worker running the current task (any pool), None when eager."""
    from celery import current_task

    request = getattr(current_task, "request", None) if current_task else None
    if request is None or getattr(request, "is_eager", False):
        return None
    return getattr(request, "hostname", None) or None
