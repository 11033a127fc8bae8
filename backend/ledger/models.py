"""The chain mirrored into the database by the event indexer (never written by views).

Addresses are checksummed hex, hashes and references 0x-hex. ``ChainEvent`` keeps every event
(unique on tx hash + log index, so a replay inserts nothing twice); the typed tables are
projections of those events that the node backend queries.
"""

from __future__ import annotations

from django.db import models

ADDRESS = 42
HASH = 66
REFERENCE = 130


class ChainEvent(models.Model):
    contract = models.CharField(max_length=40)
    address = models.CharField(max_length=ADDRESS)
    name = models.CharField(max_length=64, db_index=True)
    block_number = models.PositiveBigIntegerField(db_index=True)
    tx_hash = models.CharField(max_length=HASH)
    log_index = models.PositiveIntegerField()
    args = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tx_hash", "log_index"], name="ledger_event_unique_log")
        ]
        ordering = ["block_number", "log_index"]

    def __str__(self) -> str:
        return f"{self.name}@{self.block_number}:{self.log_index}"


class IndexerCursor(models.Model):
    """The last block whose events are all in the database, per (chain, deployment)."""

    key = models.CharField(max_length=128, unique=True)
    last_block = models.BigIntegerField()
    updated = models.DateTimeField(auto_now=True)


class Node(models.Model):
    class Status(models.TextChoices):
        APPLIED = "applied"
        MEMBER = "member"
        LEFT = "left"
        REMOVED = "removed"

    address = models.CharField(max_length=ADDRESS, unique=True)
    name = models.CharField(max_length=200)
    endpoint = models.CharField(max_length=500)
    pubkey = models.CharField(max_length=REFERENCE)
    overlay = models.CharField(max_length=HASH)
    status = models.CharField(max_length=10, choices=Status.choices)
    updated_block = models.PositiveBigIntegerField()


class Job(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"
        FAILED = "failed"

    job_id = models.PositiveBigIntegerField(unique=True)
    proposer = models.CharField(max_length=ADDRESS)
    config_hash = models.CharField(max_length=HASH)
    initial_model_ref = models.CharField(max_length=REFERENCE)
    initial_model_hash = models.CharField(max_length=HASH)
    rounds = models.PositiveIntegerField()
    committee_size = models.PositiveIntegerField()
    top_k = models.PositiveIntegerField()
    min_trainers = models.PositiveIntegerField()
    use_blocks = models.BooleanField(default=False)
    join_deadline = models.PositiveBigIntegerField()
    train_period = models.PositiveBigIntegerField()
    score_period = models.PositiveBigIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices)
    current_round = models.PositiveIntegerField(default=0)
    model_hash = models.CharField(max_length=HASH, blank=True)
    proposed_block = models.PositiveBigIntegerField()


class Participant(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="participants")
    node = models.CharField(max_length=ADDRESS)
    dataset_id = models.PositiveBigIntegerField()
    index = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "node"], name="ledger_participant_unique")]


class Round(models.Model):
    class Status(models.TextChoices):
        TRAINING = "training"
        AGGREGATING = "aggregating"
        DONE = "done"
        FAILED = "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="rounds_set")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=12, choices=Status.choices)
    base_model_hash = models.CharField(max_length=HASH)
    update_deadline = models.PositiveBigIntegerField()
    score_deadline = models.PositiveBigIntegerField()
    opened_block = models.PositiveBigIntegerField()
    finalized_block = models.PositiveBigIntegerField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="ledger_round_unique")]


class CommitteeSeat(models.Model):
    """Who sits on the committee of a round (scores it), seat by seat."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="committee_seats")
    round = models.PositiveIntegerField()
    seat = models.PositiveIntegerField()
    member = models.CharField(max_length=ADDRESS)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "round", "seat"], name="ledger_seat_unique")]


class Update(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="updates")
    round = models.PositiveIntegerField()
    trainer = models.CharField(max_length=ADDRESS)
    index = models.PositiveIntegerField()
    reference = models.CharField(max_length=REFERENCE)
    content_hash = models.CharField(max_length=HASH)
    samples = models.PositiveBigIntegerField()
    median = models.PositiveIntegerField(null=True)
    rank = models.PositiveIntegerField(null=True)
    accepted = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "round", "trainer"], name="ledger_update_unique")
        ]


class Score(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="scores")
    round = models.PositiveIntegerField()
    member = models.CharField(max_length=ADDRESS)
    trainer = models.CharField(max_length=ADDRESS)
    score = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "round", "member", "trainer"], name="ledger_score_unique")
        ]


class AcceptedUpdate(models.Model):
    """A round's accepted set, in the contract's order (the order aggregation uses)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="accepted")
    round = models.PositiveIntegerField()
    position = models.PositiveIntegerField()
    trainer = models.CharField(max_length=ADDRESS)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "round", "position"], name="ledger_accepted_unique")
        ]
        ordering = ["job", "round", "position"]


class GlobalModelProposal(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="proposals")
    round = models.PositiveIntegerField()
    proposer = models.CharField(max_length=ADDRESS)
    reference = models.CharField(max_length=REFERENCE)
    model_hash = models.CharField(max_length=HASH)
    votes = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "round", "model_hash"], name="ledger_proposal_unique")
        ]


class GlobalModel(models.Model):
    """The global model fixed by the committee's quorum after a round."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="global_models")
    round = models.PositiveIntegerField()
    model_hash = models.CharField(max_length=HASH)
    reference = models.CharField(max_length=REFERENCE)
    proposer = models.CharField(max_length=ADDRESS)
    fixed_block = models.PositiveBigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "round"], name="ledger_global_model_unique")]


class Dataset(models.Model):
    dataset_id = models.PositiveBigIntegerField(unique=True)
    owner = models.CharField(max_length=ADDRESS)
    content_hash = models.CharField(max_length=HASH)
    swarm_ref = models.CharField(max_length=HASH)
    schema_hash = models.CharField(max_length=HASH)
    samples = models.PositiveBigIntegerField()
    privacy_cap = models.PositiveBigIntegerField()
    privacy_spent = models.PositiveBigIntegerField(default=0)
    registered_block = models.PositiveBigIntegerField()


class Grant(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="grants")
    grantee = models.CharField(max_length=ADDRESS)
    wrapped_key = models.TextField()
    active = models.BooleanField(default=True)
    granted_block = models.PositiveBigIntegerField()
    revoked_block = models.PositiveBigIntegerField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "grantee"], name="ledger_grant_unique")]


class PrivacySpend(models.Model):
    """Privacy (micro-epsilon) spent by one job on one dataset."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="privacy_spends")
    job_id = models.PositiveBigIntegerField()
    spent = models.PositiveBigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "job_id"], name="ledger_privacy_unique")]
