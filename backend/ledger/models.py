"""The chain mirrored into the database by the event indexer (never written by views).

Addresses are checksummed hex, hashes and references 0x-hex. ``ChainEvent`` keeps every event
(unique on tx hash + log index, so a replay inserts nothing twice); the typed tables are
projections of those events that the node backend queries. ``RejectedEvent`` keeps the events
the indexer could not decode or store, with the reason, so that one hostile event is visible
and skipped instead of halting the mirror.

Ids, amounts, sample counts and deadlines are Solidity uint64/uint256: anything up to 2^256 - 1
can reach us, and a signed 64-bit column (SQLite's only integer) overflows at 2^63, MariaDB's
DECIMAL stops at 65 digits. They are ``Uint256Field``s: fixed-width decimal text, lossless and
ordered on every database, ints in Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db import models

if TYPE_CHECKING:
    from django.db.models.expressions import Combinable

ADDRESS = 42
HASH = 66
REFERENCE = 130
UINT256_MAX = 2**256 - 1
UINT256_DIGITS = 78  # len(str(2**256 - 1))


class Uint256Field(models.CharField):
    """An unsigned integer below 2^256, stored as 78 zero-padded decimal digits.

    Zero padding keeps the text order equal to the numeric order, so ``=``, ``<``, ``in`` and
    ``order_by`` work as on an integer column; arithmetic in SQL (F() + 1, Sum) does not: the
    mirror never needs it. Python code reads and writes plain ints.
    """

    if TYPE_CHECKING:  # what the Django stubs' plugin types the attribute as: an int
        _pyi_private_set_type: int | Combinable
        # The stubs fix a CharField's Python type to str; this one converts to and from int.
        _pyi_private_get_type: int  # type: ignore[assignment]

    def __init__(self, *args, **kwargs):
        kwargs["max_length"] = UINT256_DIGITS
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("max_length", None)
        return name, path, args, kwargs

    def from_db_value(self, value, expression, connection):
        return None if value is None else int(value)

    def to_python(self, value):
        if value is None or isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValidationError(f"{value!r} is not an unsigned integer") from None

    def get_prep_value(self, value):
        try:
            value = self.to_python(value)
        except ValidationError:  # as an integer field's lookups: a ValueError, not a 500's mystery
            raise ValueError(f"Field '{self.name}' expected a number but got {value!r}.") from None
        if value is None:
            return None
        if not 0 <= value <= UINT256_MAX:
            raise ValueError(f"{value} is outside uint256")
        return f"{value:0{UINT256_DIGITS}d}"


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


class RejectedEvent(models.Model):
    """A log of the DeFL contracts that the indexer skipped: undecodable, out of bounds, or
    refused by the database. The mirror has no row for it; the cursor moved past it."""

    MAX_DATA = 4096  # hex characters of the log's data kept (a hostile log may be megabytes)
    MAX_REASON = 500

    contract = models.CharField(max_length=40, blank=True)
    address = models.CharField(max_length=ADDRESS)
    name = models.CharField(max_length=64, blank=True, help_text="the event's name, if it was known")
    block_number = models.PositiveBigIntegerField(db_index=True)
    tx_hash = models.CharField(max_length=HASH)
    log_index = models.PositiveIntegerField()
    reason = models.CharField(max_length=MAX_REASON)
    topics = models.JSONField(default=list)
    data = models.TextField(blank=True, help_text="the log's data as 0x-hex, cut at MAX_DATA characters")
    data_size = models.PositiveIntegerField(default=0, help_text="the log data's full size in bytes")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tx_hash", "log_index"], name="ledger_rejected_unique_log")
        ]
        ordering = ["block_number", "log_index"]

    def __str__(self) -> str:
        return f"rejected {self.name or '?'}@{self.block_number}:{self.log_index}: {self.reason}"


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
        DRAWING = "drawing"  # started: the participants reveal their draw secrets
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"
        FAILED = "failed"

    job_id = Uint256Field(unique=True)
    proposer = models.CharField(max_length=ADDRESS)
    config_hash = models.CharField(max_length=HASH)
    initial_model_ref = models.CharField(max_length=REFERENCE)
    initial_model_hash = models.CharField(max_length=HASH)
    rounds = models.PositiveIntegerField()
    committee_size = models.PositiveIntegerField()
    top_k = models.PositiveIntegerField()
    min_trainers = models.PositiveIntegerField()
    use_blocks = models.BooleanField(default=False)
    join_deadline = Uint256Field()
    train_period = Uint256Field()
    score_period = Uint256Field()
    # The job's planned bound on one privacy spend (micro-epsilon; 0: a job without DP).
    max_spend_per_round = Uint256Field(default=0)
    # Basis points an update's median must beat the base model's median by (the margin rule).
    margin = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices)
    current_round = models.PositiveIntegerField(default=0)
    model_hash = models.CharField(max_length=HASH, blank=True)
    proposed_block = models.PositiveBigIntegerField()
    # DrawOpened: the participants' draw secrets are due by this deadline (null before the start)
    draw_deadline = Uint256Field(null=True)


class Participant(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="participants")
    node = models.CharField(max_length=ADDRESS)
    dataset_id = Uint256Field()
    index = models.PositiveIntegerField()
    # revealed its draw secret (DrawSecretRevealed): it may train and sit on committees
    drawn = models.BooleanField(default=False)
    # withheld a reveal of scores it committed to (ScoresWithheld): never seated again in the job
    banned = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "node"], name="ledger_participant_unique")]


class Round(models.Model):
    class Status(models.TextChoices):
        TRAINING = "training"
        AGGREGATING = "aggregating"
        DONE = "done"
        FAILED = "failed"
        SKIPPED = "skipped"  # its aggregation deadline passed: the previous model carried forward

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="rounds_set")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=12, choices=Status.choices)
    base_model_hash = models.CharField(max_length=HASH)
    update_deadline = Uint256Field()
    score_deadline = Uint256Field()
    opened_block = models.PositiveBigIntegerField()
    finalized_block = models.PositiveBigIntegerField(null=True)
    # the median of the committee's scores of the base model (RoundFinalized); null before
    base_median = models.PositiveIntegerField(null=True)
    # the new committee's deadline to fix the round's model (RoundFinalized); null before
    aggregate_deadline = Uint256Field(null=True)
    # the job's random state after the round (RoundFinalized): orders equal medians, draws seats
    seed = models.CharField(max_length=HASH, blank=True)

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
    samples = Uint256Field()
    median = models.PositiveIntegerField(null=True)
    # position among the accepted (RoundFinalized lists them best first); null when not accepted
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
    """A (model hash, reference) pair the aggregating committee voted for; ``proposer``: its first
    voter; ``votes``: how many members voted for exactly this pair (GlobalModelVoted)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="proposals")
    round = models.PositiveIntegerField()
    proposer = models.CharField(max_length=ADDRESS)
    reference = models.CharField(max_length=REFERENCE)
    model_hash = models.CharField(max_length=HASH)
    votes = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            # a hash may be proposed with several references: each (hash, reference) is a proposal
            models.UniqueConstraint(
                fields=["job", "round", "model_hash", "reference"], name="ledger_proposal_pair_unique"
            )
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


class BudgetSource(models.Model):
    """A privacy budget on chain shared by datasets that may hold the same records (a provider's
    datasets unless declared disjoint): its cap is the smallest of theirs (micro-epsilon)."""

    source_id = Uint256Field(unique=True)
    owner = models.CharField(max_length=ADDRESS)
    cap = Uint256Field()
    spent = Uint256Field(default=0)


class Dataset(models.Model):
    dataset_id = Uint256Field(unique=True)
    owner = models.CharField(max_length=ADDRESS)
    # keyed by the owner's node: says nothing about the records (DataRegistry)
    commitment = models.CharField(max_length=HASH)
    swarm_ref = models.CharField(max_length=HASH)
    schema_hash = models.CharField(max_length=HASH)
    samples = Uint256Field()
    privacy_cap = Uint256Field()
    # its source's spend (every dataset of the source shows the same): what is left is cap - spent
    privacy_spent = Uint256Field(default=0)
    registered_block = models.PositiveBigIntegerField()
    source = models.ForeignKey(BudgetSource, on_delete=models.PROTECT, null=True, related_name="datasets")
    disjoint = models.BooleanField(default=False)


class Grant(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="grants")
    grantee = models.CharField(max_length=ADDRESS)
    wrapped_key = models.TextField()
    active = models.BooleanField(default=True)
    cap = Uint256Field(default=0)  # micro-epsilon the grantee's jobs may spend on the dataset
    granted_block = models.PositiveBigIntegerField()
    revoked_block = models.PositiveBigIntegerField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "grantee"], name="ledger_grant_unique")]


class PrivacySpend(models.Model):
    """Privacy (micro-epsilon) spent by one job on one dataset."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="privacy_spends")
    job_id = Uint256Field()
    spent = Uint256Field()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "job_id"], name="ledger_privacy_unique")]


class PrivacyRecord(models.Model):
    """One recorded release (PrivacySpent): what anyone needs to recompute a participant's epsilon
    in a job, together with the job's public plan."""

    class Kind(models.IntegerChoices):
        UPDATE = 0, "update"  # a published training update
        SCORES = 1, "scores"  # a committee member's noisy scores
        WITHHELD = 2, "withheld"  # a training release computed and never published

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="privacy_records")
    job_id = Uint256Field()
    round = models.PositiveIntegerField()
    spender = models.CharField(max_length=ADDRESS)
    amount = Uint256Field()
    kind = models.PositiveSmallIntegerField(choices=Kind.choices)
    steps = models.PositiveIntegerField(default=0)
    block = models.PositiveBigIntegerField()
    log_index = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["block", "log_index"], name="ledger_privacy_record_unique")
        ]
        indexes = [models.Index(fields=["job_id", "spender"])]


class ScoreCommitment(models.Model):
    """This node's own score commitment for a round (commit-reveal): the salt and the exact scores
    it committed to, kept until it reveals them. Not a mirror of the chain but this node's secret:
    the salt must survive a restart (a member that lost it cannot reveal and counts as absent),
    and the scores are noisy releases that must be revealed as committed, never recomputed."""

    node = models.CharField(max_length=ADDRESS)
    job_id = Uint256Field()
    round = models.PositiveIntegerField()
    salt = models.CharField(max_length=HASH)  # 0x + 64 hex digits, from a CSPRNG
    scores = models.JSONField()  # [[trainer, score], ...] in the committed order
    base_score = models.PositiveIntegerField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "job_id", "round"], name="one_score_commitment_per_round")
        ]
