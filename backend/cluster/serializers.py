"""Typed shapes of the cluster endpoints (so the OpenAPI schema names every field)."""

from __future__ import annotations

from rest_framework import serializers

from backend.cluster.models import PRIORITY_MAX, PRIORITY_MIN, DeviceSlot, Task, Worker


class SlotSerializer(serializers.ModelSerializer):
    device = serializers.CharField(source="device_name", help_text="cpu, or cuda:<index>")
    free = serializers.IntegerField(help_text="capacity not held by a task")
    load = serializers.FloatField(help_text="held / capacity, 0..1")

    class Meta:
        model = DeviceSlot
        fields = ["id", "kind", "index", "device", "name", "capacity", "used", "free", "load", "running"]
        extra_kwargs = {
            "capacity": {"help_text": "CPU cores, or a GPU's memory in MB"},
            "used": {"help_text": "held by running tasks (cores, or MB)"},
            "running": {"help_text": "tasks computing on it now"},
        }


class WorkerSerializer(serializers.ModelSerializer):
    live = serializers.BooleanField(help_text="online and heartbeating within the timeout")
    slots = SlotSerializer(many=True)

    class Meta:
        model = Worker
        fields = ["id", "name", "host", "pid", "queue", "state", "live", "started", "last_heartbeat", "slots"]


def error_summary(error: str) -> str:
    """What a provider or viewer reads of a task's error: its kind, never its text.

    The text can name paths, peers and the values the task saw in its data; the operator reads
    it (and the log) in full, everyone else this."""
    if not error:
        return ""
    kind = error.split(":", 1)[0].strip()
    kind = kind if kind.isidentifier() and len(kind) <= 64 else "an error"
    return f"{kind} (the node's operator sees the details)"


class TaskSerializer(serializers.ModelSerializer):
    """A task; ``error`` and ``log`` in full for operators only (context ``operator``), else a summary."""

    queue_position = serializers.IntegerField(
        allow_null=True, help_text="1-based place in this node's queue while queued, else null"
    )
    worker = serializers.CharField(source="worker.name", allow_null=True, default=None)
    device = serializers.CharField(source="slot.device_name", allow_null=True, default=None)

    class Meta:
        model = Task
        fields = [
            "id", "job_id", "round", "kind", "state", "priority", "queue_position", "attempts",
            "max_attempts", "next_retry_at", "cancel_requested", "worker", "device", "amount",
            "created", "started_at", "finished_at", "wait_s", "duration_s", "error", "log",
        ]  # fmt: skip
        extra_kwargs = {
            "error": {"help_text": "the last failure: in full for operators, its kind for other roles"},
            "log": {"help_text": "the task's log lines: operators only (empty for other roles)"},
        }

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if not self.context.get("operator"):
            data["error"] = error_summary(data.get("error") or "")
            if "log" in data:
                data["log"] = ""
        return data


class TaskBriefSerializer(TaskSerializer):
    """A task without its log (the cluster view lists many)."""

    class Meta(TaskSerializer.Meta):
        fields = [f for f in TaskSerializer.Meta.fields if f != "log"]


class ClusterTotalsSerializer(serializers.Serializer):
    workers = serializers.IntegerField()
    live_workers = serializers.IntegerField()
    cpu_cores = serializers.IntegerField(help_text="cores of live workers")
    cpu_used = serializers.IntegerField()
    gpus = serializers.IntegerField()
    gpu_memory_mb = serializers.IntegerField()
    gpu_memory_used_mb = serializers.IntegerField()
    running = serializers.IntegerField()
    queued = serializers.IntegerField()


class ClusterSerializer(serializers.Serializer):
    totals = ClusterTotalsSerializer()
    workers = WorkerSerializer(many=True)
    running = TaskBriefSerializer(many=True)
    queued = TaskBriefSerializer(many=True)
    recent_failures = TaskBriefSerializer(
        many=True, help_text="failed tasks and failed attempts, newest first"
    )


class JobTasksSerializer(serializers.Serializer):
    job_id = serializers.IntegerField()
    priority = serializers.IntegerField()
    tasks = TaskSerializer(many=True)


class PrioritySerializer(serializers.Serializer):
    priority = serializers.IntegerField(
        min_value=PRIORITY_MIN, max_value=PRIORITY_MAX, help_text="higher runs first; 0 is the default"
    )


class PriorityResultSerializer(serializers.Serializer):
    job_id = serializers.IntegerField()
    priority = serializers.IntegerField()
    updated_tasks = serializers.IntegerField(
        help_text="queued or running tasks of the job given the priority"
    )
