"""Cluster endpoints: the node's workers, slots and tasks; per job its tasks, cancel and priority."""

from __future__ import annotations

from django.db.models import Q, Sum
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.errors import Conflict, NotFound
from backend.api.permissions import OperatorWrites
from backend.cluster import registry, runner
from backend.cluster.models import DeviceSlot, Task, Worker
from backend.cluster.serializers import (
    ClusterSerializer,
    JobTasksSerializer,
    PriorityResultSerializer,
    PrioritySerializer,
    TaskSerializer,
)
from backend.identity.roles import Role, role_of
from backend.ledger import models as mirror

LIST_LIMIT = 100  # tasks per list of the cluster view
JOB_TASKS_LIMIT = 200  # a job's newest tasks (one per round and kind)


def _annotated(tasks, positions: dict[int, int]) -> list[Task]:
    tasks = list(tasks)
    for task in tasks:
        task.queue_position = positions.get(task.pk)
    return tasks


def _tasks():
    return Task.objects.select_related("worker", "slot")


def _shown_to(request) -> dict:
    """Serializer context: raw errors and logs for operators, a summary for other roles."""
    return {"operator": role_of(request.user) == Role.OPERATOR}


class ClusterView(APIView):
    """Workers with their device slots and load, running and queued tasks, recent failures."""

    permission_classes = [OperatorWrites]

    @extend_schema(responses={200: ClusterSerializer}, operation_id="cluster_retrieve")
    def get(self, request):
        workers = list(Worker.objects.prefetch_related("slots"))
        for worker in workers:
            worker.live = registry.is_live(worker)
        live = [w.pk for w in workers if w.live]
        slots = DeviceSlot.objects.filter(worker_id__in=live)
        cpu = slots.filter(kind=DeviceSlot.Kind.CPU).aggregate(c=Sum("capacity"), u=Sum("used"))
        gpu = slots.filter(kind=DeviceSlot.Kind.CUDA).aggregate(c=Sum("capacity"), u=Sum("used"))
        positions = runner.queue_positions()
        running = _tasks().filter(state=Task.State.RUNNING).order_by("started_at")
        queued = _tasks().filter(state=Task.State.QUEUED).order_by("-priority", "created", "pk")
        failures = (
            _tasks()
            .filter(Q(state=Task.State.FAILED) | ~Q(error=""))
            .exclude(state=Task.State.SUCCEEDED)
            .order_by("-finished_at", "-pk")
        )
        payload = {
            "totals": {
                "workers": len(workers),
                "live_workers": len(live),
                "cpu_cores": cpu["c"] or 0,
                "cpu_used": cpu["u"] or 0,
                "gpus": slots.filter(kind=DeviceSlot.Kind.CUDA).count(),
                "gpu_memory_mb": gpu["c"] or 0,
                "gpu_memory_used_mb": gpu["u"] or 0,
                "running": running.count(),
                "queued": len(positions),
            },
            "workers": workers,
            "running": _annotated(running[:LIST_LIMIT], positions),
            "queued": _annotated(queued[:LIST_LIMIT], positions),
            "recent_failures": _annotated(failures[:LIST_LIMIT], positions),
        }
        return Response(ClusterSerializer(payload, context=_shown_to(request)).data)


def _job_exists(job_id: int) -> bool:
    return mirror.Job.objects.filter(job_id=job_id).exists() or Task.objects.filter(job_id=job_id).exists()


class JobTasksView(APIView):
    """A job's local tasks on this node (newest round first) with queue position, timings and logs."""

    permission_classes = [OperatorWrites]

    @extend_schema(responses={200: JobTasksSerializer}, operation_id="jobs_tasks_list")
    def get(self, request, job_id: int):
        if not _job_exists(job_id):
            raise NotFound(f"no job {job_id} on chain (or not indexed yet)")
        tasks = _tasks().filter(job_id=job_id).order_by("-round", "-pk")[:JOB_TASKS_LIMIT]
        payload = {
            "job_id": job_id,
            "priority": runner.job_priority(job_id),
            "tasks": _annotated(tasks, runner.queue_positions()),
        }
        return Response(JobTasksSerializer(payload, context=_shown_to(request)).data)


class TaskCancelView(APIView):
    """Cancel a queued task now, or a running one when its attempt ends (its output is discarded)."""

    permission_classes = [OperatorWrites]

    @extend_schema(request=None, responses={200: TaskSerializer}, operation_id="jobs_tasks_cancel")
    def post(self, request, job_id: int, task_id: int):
        task = Task.objects.filter(pk=task_id, job_id=job_id).first()
        if task is None:
            raise NotFound(f"job {job_id} has no task {task_id}")
        try:
            task = runner.cancel(task)
        except runner.NotCancellable as exc:
            raise Conflict(str(exc)) from exc
        task = _tasks().get(pk=task.pk)
        task.queue_position = None
        return Response(TaskSerializer(task, context=_shown_to(request)).data)


class JobPriorityView(APIView):
    """Set a job's priority on this node: its queued tasks and every later one (operators only)."""

    permission_classes = [OperatorWrites]

    @extend_schema(
        request=PrioritySerializer,
        responses={200: PriorityResultSerializer},
        operation_id="jobs_tasks_priority",
    )
    def post(self, request, job_id: int):
        form = PrioritySerializer(data=request.data)
        form.is_valid(raise_exception=True)
        if not _job_exists(job_id):
            raise NotFound(f"no job {job_id} on chain (or not indexed yet)")
        value = form.validated_data["priority"]
        updated = runner.set_priority(job_id, value)
        return Response({"job_id": job_id, "priority": value, "updated_tasks": updated})
