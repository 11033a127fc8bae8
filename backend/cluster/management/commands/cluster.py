"""``manage.py cluster status`` lists workers and slots; ``cluster probe`` runs probe tasks on them.

A probe is a short matrix-multiply task placed like a round's training (greedily, on the live
slot with the most free capacity) and sent to that worker's own queue: it checks that a worker
just added on another machine receives and runs work, and logs its speed.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Max

from backend.cluster import registry, runner
from backend.cluster.models import Task, Worker
from backend.cluster.tasks import MAX_PROBE_S, probe

MAX_PROBES = 64


class Command(BaseCommand):
    help = "Cluster of this node: status (workers, slots, tasks) or probe (run probe tasks on the workers)"

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("status", help="workers with their slots and load")
        p = sub.add_parser("probe", help="place probe tasks greedily on the live workers and run them")
        p.add_argument("--count", type=int, default=1, help=f"probe tasks (1..{MAX_PROBES})")
        p.add_argument("--seconds", type=float, default=0.5, help=f"work per probe (at most {MAX_PROBE_S} s)")
        p.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the probes to end")

    def handle(self, *args, action: str, **options):
        if action == "status":
            return self._status()
        return self._probe(options["count"], options["seconds"], options["wait"])

    def _status(self) -> None:
        for worker in Worker.objects.prefetch_related("slots"):
            live = "live" if registry.is_live(worker) else "offline"
            self.stdout.write(f"{worker.name} ({live}, heartbeat {worker.last_heartbeat:%H:%M:%S})")
            for slot in worker.slots.all():
                self.stdout.write(
                    f"  {slot.device_name:8} {slot.name[:30]:30} {slot.used}/{slot.capacity} used, {slot.running} running"
                )
        open_tasks = Task.objects.filter(state__in=Task.OPEN).count()
        self.stdout.write(f"open tasks: {open_tasks}")

    def _probe(self, count: int, seconds: float, wait: float) -> None:
        if not 1 <= count <= MAX_PROBES:
            raise CommandError(f"--count must be between 1 and {MAX_PROBES}")
        if not 0 <= seconds <= MAX_PROBE_S:
            raise CommandError(f"--seconds must be between 0 and {MAX_PROBE_S}")
        first = (Task.objects.filter(kind=Task.Kind.PROBE).aggregate(m=Max("round"))["m"] or 0) + 1
        rounds = list(range(first, first + count))
        for round_ in rounds:
            task = runner.enqueue(0, round_, Task.Kind.PROBE)
            if settings.CELERY_TASK_ALWAYS_EAGER:
                probe.delay(round_, seconds)  # the in-process runner: this process is the worker
                continue
            worker = runner.route(task)
            if worker is None or not worker.queue:
                raise CommandError("no live worker has a free slot: start one (README, Cluster) and retry")
            from celery.utils.nodenames import worker_direct

            probe.apply_async((round_, seconds), queue=worker_direct(worker.queue))
            self.stdout.write(f"probe {round_} placed on {worker.name}")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            tasks = list(Task.objects.filter(kind=Task.Kind.PROBE, round__in=rounds).select_related("worker"))
            if all(t.state not in Task.OPEN for t in tasks):
                break
            time.sleep(0.2)
        failed = 0
        probes = Task.objects.filter(kind=Task.Kind.PROBE, round__in=rounds).order_by("round")
        for task in probes.select_related("worker", "slot"):
            where = f"{task.worker.name if task.worker else '?'} {task.slot.device_name if task.slot else ''}"
            self.stdout.write(
                f"probe {task.round}: {task.state} on {where.strip()} ({task.duration_s or 0:.2f} s)"
            )
            failed += task.state != Task.State.SUCCEEDED
        if failed:
            raise CommandError(f"{failed} of {count} probes did not succeed")
