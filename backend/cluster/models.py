"""Workers, their device slots and the local tasks placed on them (this node's database only).

Nothing here crosses a trust boundary except through the API: text that a task records is
bounded (``LOG_LIMIT``, ``ERROR_LIMIT``) so a chatty or failing task cannot grow a row without end.
"""

from __future__ import annotations

from django.db import models

LOG_LIMIT = 16_000  # characters of a task's log kept (its tail)
ERROR_LIMIT = 2_000
PRIORITY_MIN, PRIORITY_MAX = -100, 100


class Worker(models.Model):
    class State(models.TextChoices):
        ONLINE = "online"
        STOPPED = "stopped"

    name = models.CharField(max_length=200, unique=True)  # Celery's node name (w2@host) or local@host
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField(default=0)
    queue = models.CharField(max_length=255, blank=True)  # its direct queue; empty: the in-process runner
    state = models.CharField(max_length=16, choices=State.choices, default=State.ONLINE)
    started = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    # Not a column: the cluster view sets it (registry.is_live) for the worker's serializer.
    live: bool

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DeviceSlot(models.Model):
    class Kind(models.TextChoices):
        CPU = "cpu"
        CUDA = "cuda"

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="slots")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    index = models.PositiveSmallIntegerField(default=0)
    name = models.CharField(max_length=200, blank=True)  # e.g. the GPU's model
    # fl_node.scheduler's units: CPU cores, or a GPU's memory in MB. Tasks hold part of it while
    # they compute; several jobs share a device while their demands fit.
    capacity = models.PositiveIntegerField(default=1)
    used = models.PositiveIntegerField(default=0)
    running = models.PositiveSmallIntegerField(default=0)  # tasks holding part of it now

    class Meta:
        ordering = ["worker__name", "kind", "index"]
        constraints = [
            models.UniqueConstraint(fields=["worker", "kind", "index"], name="cluster_slot_unique")
        ]

    @property
    def device_name(self) -> str:
        return "cpu" if self.kind == self.Kind.CPU else f"cuda:{self.index}"

    @property
    def free(self) -> int:
        return max(self.capacity - self.used, 0)

    @property
    def load(self) -> float:
        return min(self.used / self.capacity, 1.0) if self.capacity else 1.0


class JobQueue(models.Model):
    """A job's place in this node's task queue: its priority (operators change it)."""

    job_id = models.PositiveBigIntegerField(unique=True)
    priority = models.SmallIntegerField(default=0)


class Task(models.Model):
    class Kind(models.TextChoices):
        TRAIN = "train"  # a round's local training
        PROBE = "probe"  # a short measurement of a slot (manage.py cluster probe)

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    OPEN = (State.QUEUED, State.RUNNING)

    # The node (chain address) whose task it is: one per database in production; the protocol
    # tests run several node identities on one database.
    node = models.CharField(max_length=42, blank=True, default="")
    job_id = models.PositiveBigIntegerField(db_index=True)
    round = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TRAIN)
    priority = models.SmallIntegerField(default=0)  # higher runs first; ties in arrival order
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks")
    slot = models.ForeignKey(
        DeviceSlot, null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks"
    )
    amount = models.PositiveIntegerField(default=0)  # what it holds of its slot: cores, or MB on a GPU
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    polled_at = models.DateTimeField(null=True, blank=True)  # its runner waits for a slot (fresh: alive)
    wait_s = models.FloatField(default=0.0)  # queued before its last attempt started
    duration_s = models.FloatField(null=True, blank=True)  # its last attempt's run time
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "job_id", "round", "kind"], name="cluster_task_once_per_round"
            )
        ]
        indexes = [models.Index(fields=["state", "-priority", "created"], name="cluster_task_queue")]

    def __str__(self) -> str:
        return f"{self.kind} job {self.job_id} round {self.round} ({self.state})"


class WorkController(models.Model):
    """This node's AIMD controller of one job's local work (backend.jobs.driver.adaptive_work).

    Kept here, not in memory, so a node that restarts continues from the work it had found
    instead of starting over from the nominal steps (and so two processes of one node agree).
    """

    node = models.CharField(max_length=42, blank=True, default="")
    job_id = models.PositiveBigIntegerField()
    steps = models.PositiveIntegerField(default=1)  # the local steps of the next round
    # fl_node.scheduler.AimdController.state(): slow start, smoothed step time and its deviation.
    state = models.JSONField(default=dict)
    last_round = models.PositiveIntegerField(default=0)  # the last round observed (each counts once)
    last_steps = models.PositiveIntegerField(default=0)
    last_seconds = models.FloatField(default=0.0)
    target_seconds = models.FloatField(default=0.0)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job_id"], name="cluster_work_controller_once")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.steps} steps"
