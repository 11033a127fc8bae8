"""This node's own records about federated jobs. The chain's view lives in backend.ledger.models.

Rows carry the acting node's address, so that one database can serve several node
identities (the in-process protocol tests do) without their claims colliding.
"""

from django.db import models

from fl_node.job.limits import MAX_JOB_NAME

ADDRESS = 42


class JobRecord(models.Model):
    """A job's configuration as this node knows it (proposed here, or fetched by its config hash)."""

    onchain_id = models.PositiveBigIntegerField(unique=True)
    name = models.CharField(max_length=MAX_JOB_NAME)
    config = models.JSONField(help_text="the canonical job configuration (backend.jobs.config.JobConfig)")
    config_hash = models.CharField(max_length=66, help_text="swarm reference of the config = configHash")
    initial_model_ref = models.CharField(max_length=130)
    initial_model_hash = models.CharField(max_length=66)
    proposer = models.CharField(max_length=ADDRESS)
    tx_hash = models.CharField(max_length=80, blank=True, help_text="proposeJob, when proposed here")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-onchain_id"]

    def __str__(self) -> str:
        return f"job {self.onchain_id} ({self.name})"


class Membership(models.Model):
    """A node joined a job with one of its datasets."""

    node = models.CharField(max_length=ADDRESS)
    job_id = models.PositiveBigIntegerField()
    dataset = models.ForeignKey("datasets.Dataset", on_delete=models.PROTECT, related_name="+")
    tx_hash = models.CharField(max_length=80, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    prepared_at = models.DateTimeField(
        null=True, blank=True, help_text="when this node had the job's first round ready (driver.warmup)"
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "job_id"], name="jobs_one_membership")]


class RoundAction(models.Model):
    """The claim on one action of one round: at most one worker runs it, and it runs once.

    queued (the agent enqueued it) -> running (a worker took it) -> done | waiting | failed.
    ``waiting``: nothing to do yet (e.g. not this member's turn to propose); the agent
    re-plans it. A queued or running claim older than the lease is considered lost
    (its worker died) and may be taken again; the chain's own checks stop a repeat.
    """

    class Kind(models.TextChoices):
        TRAIN = "train"
        SCORE = "score"
        FINALIZE = "finalize"
        AGGREGATE = "aggregate"
        REGISTER = "register"  # serve a fixed global model (hot swap)
        MEASURE = "measure"  # record its metrics on this node's validation data
        REVEAL = "reveal"  # reveal this node's draw secret once the job started (round 0)
        DRAW = "draw"  # after the reveal deadline: draw the first committee (round 0)

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        WAITING = "waiting"
        DONE = "done"
        FAILED = "failed"

    node = models.CharField(max_length=ADDRESS)
    job_id = models.PositiveBigIntegerField()
    round = models.PositiveIntegerField()
    kind = models.CharField(max_length=12, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    tx_hash = models.CharField(max_length=80, blank=True)
    detail = models.TextField(blank=True)
    budget_charged = models.BooleanField(default=False, help_text="train: the round's privacy is charged")
    # Charged locally but not yet recorded by DataRegistry.spendPrivacy: a retry sends it before
    # it submits the update (the first attempt sends it while training, in the background).
    privacy_unsent = models.PositiveBigIntegerField(
        default=0, help_text="train: micro-epsilon charged locally, not yet spent on chain"
    )
    # The planner offers a waiting score action again only when more updates are in than this.
    scored = models.PositiveIntegerField(default=0, help_text="score: updates scored so far (as they came)")
    recheck_s = models.FloatField(
        null=True, help_text="waiting: not re-run sooner than this after the last run"
    )
    seconds = models.FloatField(null=True, help_text="wall time of the last run")
    work_seconds = models.FloatField(null=True, help_text="of which local training (trainer actions)")
    parts = models.JSONField(
        default=dict,
        blank=True,
        help_text="seconds of the last run per part (driver.timing: swarm, chain_tx, ...)",
    )
    started_at = models.FloatField(null=True, help_text="Unix time the last run started")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job_id", "round", "kind"], name="jobs_one_action")
        ]
        indexes = [models.Index(fields=["node", "job_id", "state"])]

    def __str__(self) -> str:
        return f"{self.kind} job {self.job_id} round {self.round}: {self.state}"


class RoundMetric(models.Model):
    """What this node measured once a round's global model was fixed."""

    node = models.CharField(max_length=ADDRESS)
    job_id = models.PositiveBigIntegerField()
    round = models.PositiveIntegerField()
    accuracy = models.FloatField()
    loss = models.FloatField()
    epsilon = models.FloatField(help_text="privacy spent by this job on this node's dataset so far")
    model_hash = models.CharField(max_length=66)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job_id", "round"], name="jobs_one_metric_per_round")
        ]
        ordering = ["job_id", "round"]


class UpdateEncoding(models.Model):
    """How one tensor of one trainer's update travelled in one round (fl_node.sparse), as this node saw it.

    Written by the trainer for its own update and by every node that aggregates the round, for
    each accepted update it decoded: dense or a delta array, the fraction of rows it changed,
    and its bytes against what the dense form takes.
    """

    class Encoding(models.TextChoices):
        DENSE = "dense"
        DELTA = "delta"

    node = models.CharField(max_length=ADDRESS)
    job_id = models.PositiveBigIntegerField()
    round = models.PositiveIntegerField()
    trainer = models.CharField(max_length=ADDRESS)
    tensor = models.CharField(max_length=200)
    encoding = models.CharField(max_length=5, choices=Encoding.choices)
    density = models.FloatField(help_text="fraction of the tensor's rows (dim 0) the update changed")
    bytes = models.PositiveBigIntegerField(help_text="the tensor's bytes in the update as sent")
    dense_bytes = models.PositiveBigIntegerField(help_text="what the dense form takes")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "job_id", "round", "trainer", "tensor"], name="jobs_one_encoding"
            )
        ]
        indexes = [models.Index(fields=["node", "job_id", "round"])]
        ordering = ["job_id", "round", "trainer", "tensor"]


class UpdateKey(models.Model):
    """The key of one sealed update (backend.jobs.sealed), as held by ``node``.

    The trainer writes its own row before the sealed blob leaves the node (``own``); every node
    that obtained a key after the training deadline writes a row once the key opened the blob to
    the on-chain content hash, and serves it on to the job's other participants (a relay), so a
    trainer that went offline does not stop the round.
    """

    node = models.CharField(max_length=ADDRESS)
    job_id = models.PositiveBigIntegerField()
    round = models.PositiveIntegerField()
    trainer = models.CharField(max_length=ADDRESS)
    reference = models.CharField(max_length=130, help_text="swarm reference of the sealed blob")
    content_hash = models.CharField(max_length=66, help_text="hash of the plaintext update (on chain)")
    key = models.CharField(max_length=64, help_text="AES-256-GCM key, hex")
    own = models.BooleanField(default=False, help_text="sealed by this node (it is the trainer)")
    # Own rows only: what a retry after a restart needs to submit this same sealed update again
    # (under its still-open reservation) instead of a retrain, which would be charged again.
    samples = models.PositiveBigIntegerField(default=0, help_text="own: the update's samples")
    base_hash = models.CharField(max_length=66, blank=True, help_text="own: the model it was trained on")
    kind = models.CharField(max_length=32, blank=True, help_text="own: the release kind it was charged as")
    spend = models.PositiveBigIntegerField(default=0, help_text="own: micro-epsilon its submit records")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job_id", "round", "trainer"], name="jobs_one_update_key")
        ]
