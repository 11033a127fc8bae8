"""Datasets this node provides, the grants it issued, and the privacy released from them.

The encrypted swarm reference is the dataset's data key (it carries the decryption
key), so it never leaves this node in the clear: the API never returns it, and a
grant carries it only wrapped for the grantee's public key.
"""

from django.conf import settings
from django.db import models

from backend.datasets.commitment import new_secret


class Dataset(models.Model):
    class Format(models.TextChoices):
        CSV = "csv"
        NPZ = "npz"

    class Status(models.TextChoices):
        # Stored encrypted in the swarm, but the chain registration was skipped (no ledger).
        STORED = "stored"
        # Registered on chain (DataRegistry.registerDataset sent and mined).
        REGISTERED = "registered"

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    format = models.CharField(max_length=8, choices=Format.choices)
    # Public: the size registered on chain, which every public number of the dataset follows from
    # (its plans, update weights, score normalizer, stored blob's size). A DP count of the records
    # (fl_node.dp_count) when ``count_noise_std`` > 0; the exact size for a dataset registered
    # before DP counts (its budget is then accounted under replace-one).
    num_samples = models.PositiveIntegerField()
    # Local only, never published: how many records the dataset really holds.
    records = models.PositiveIntegerField(null=True, blank=True)
    # The registered count's noise std (fl_node.dp_count.COUNT_NOISE_STD); 0: the exact size.
    count_noise_std = models.FloatField(default=0.0)
    feature_shape = models.JSONField(help_text="shape of one sample, e.g. [784] or [1, 28, 28]")
    num_features = models.PositiveIntegerField()
    classes = models.JSONField(help_text="class names in class-id order")
    label_column = models.CharField(max_length=200, blank=True)
    schema_hash = models.CharField(max_length=64)
    # Local only, never published: the records' order-insensitive hash keyed with this node's
    # record key (backend.datasets.overlap), so the node refuses the same records twice.
    # Datasets uploaded before commitments were keyed hold the plain hash they registered.
    content_hash = models.CharField(max_length=64, unique=True)
    # Secret, never leaves this node: the per-dataset key of its commitment, its hold-out
    # commitment and its splits (backend.datasets.commitment). Without it nobody can tell the
    # commitment or a split of D from those of D with one record more.
    secret = models.CharField(max_length=64, blank=True, default=new_secret)
    # Public: what the chain registered (a keyed commitment; the plain content hash for a
    # dataset registered before commitments were keyed).
    commitment = models.CharField(max_length=64, blank=True)
    # Declared at upload and recorded on chain: this dataset shares no record with any other
    # dataset of this provider, so it has a budget (a source) of its own. Otherwise it shares
    # the provider's one budget with its other datasets (a rescaled copy shares no record hash).
    disjoint = models.BooleanField(default=False)
    # The chain's budget source this dataset spends against (DataRegistry.sourceOf), once known.
    onchain_source = models.CharField(max_length=80, blank=True)
    size_bytes = models.PositiveBigIntegerField(help_text="size of the canonical (plaintext) dataset")
    # Secret: the encrypted reference with its key. Never serialized to the API.
    encrypted_reference = models.CharField(max_length=512)
    # A revocation rotates the data key (services.rotate_data_key): requested at the revocation
    # (the latest one's time) until a rotation claimed after it is done; claimed by the one process
    # rotating it; the reference it replaced stays pinned (remaining grantees still read it) until
    # the chain has the new one and every live grant is wrapped for it.
    key_rotation_requested = models.DateTimeField(null=True, blank=True)
    key_rotation_claimed = models.DateTimeField(null=True, blank=True)
    retired_reference = models.CharField(max_length=512, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices)
    onchain_id = models.CharField(max_length=80, blank=True)
    tx_hash = models.CharField(max_length=80, blank=True)
    epsilon_cap = models.FloatField()
    delta = models.FloatField()
    # Declared at registration (and on chain): committee scores on this dataset's hold-out splits
    # are released exactly, without noise or charge; those records get no DP from the scores.
    public_holdout = models.BooleanField(default=False)
    # Datasets sharing records share a budget (see BudgetGroup); null only until the first charge
    # of a dataset created without an upload (tests, migrated rows without record hashes).
    budget_group = models.ForeignKey(
        "BudgetGroup", null=True, blank=True, on_delete=models.PROTECT, related_name="datasets"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.content_hash[:10]})"


class Grant(models.Model):
    """A grant this node issued: the data key wrapped for ``grantee`` (an address), recorded on chain."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="grants")
    grantee = models.CharField(max_length=42, help_text="checksummed chain address of the grantee node")
    wrapped_key = models.TextField(help_text="hex ECIES ciphertext of the encrypted reference")
    tx_hash = models.CharField(max_length=80, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    revoked = models.DateTimeField(null=True, blank=True)
    revoke_tx_hash = models.CharField(max_length=80, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        # "At most one live grant per (dataset, grantee)" is checked in services.grant_access:
        # MariaDB has no partial unique indexes, and revoked grants stay as history.


class BudgetGroup(models.Model):
    """Datasets that share one privacy budget: the provider's datasets not declared disjoint
    (the ``shared`` group, one per node), and datasets that share at least one record.

    A record in two datasets is one person's data spent twice, and two uploads of one source
    (a copy rescaled or jittered shares no record hash) are too, so every release on any member
    composes into one history, and the group's cap is its members' smallest cap. The group
    matches the chain's budget source of its datasets. The row is also the budget's lock: a
    charge holds it (SELECT ... FOR UPDATE) while it checks the cap.
    """

    created = models.DateTimeField(auto_now_add=True)
    # The node's one group of datasets not declared disjoint (at most one row has it).
    shared = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"budget group {self.pk}"


class RecordHash(models.Model):
    """A keyed hash of one record of a dataset (HMAC with a node-local key, truncated to 128 bits).

    Keyed so that a copy of the database does not let anyone test guesses of a record;
    used only to find an uploaded dataset's overlap with the datasets this node holds.
    """

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="record_hashes")
    digest = models.CharField(max_length=32, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "digest"], name="one_record_hash")]


class PrivacyRelease(models.Model):
    """One DP release computed on a dataset: the mechanism as charged, and what it did to the budget.

    reserved (charged before the computation; counts against the cap at once) -> released
    (published: update or scores submitted) | withheld (computed, never published; still counted,
    since nothing proves the output was not seen). Rows are never deleted: they are the audit
    record of the dataset's privacy. ``epsilon_after`` is the budget group's composed RDP epsilon
    at ``delta`` once this release (and every one before it, reserved included) is counted.
    """

    class Status(models.TextChoices):
        RESERVED = "reserved"
        RELEASED = "released"
        WITHHELD = "withheld"

    class Kind(models.TextChoices):
        DP_SGD = "dp_sgd"
        UPDATE_GAUSSIAN = "update_gaussian"
        SCORE_COUNT = "score_count"
        COUNT = "count"  # the dataset's registered DP count (its first release)

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="releases")
    job = models.CharField(max_length=80)
    # Null for releases recorded without a round (BudgetSpend rows migrated, reserve_budget).
    round = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    noise_multiplier = models.FloatField(help_text="noise std / the release's record-level L2 sensitivity")
    sample_rate = models.FloatField()
    steps = models.PositiveIntegerField()
    delta = models.FloatField(help_text="the delta epsilon_after is stated at (the budget group's)")
    epsilon_after = models.FloatField()
    micro_epsilon = models.PositiveBigIntegerField(
        default=0, help_text="the rise of the budget's epsilon, in micro-epsilon (what the chain is told)"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RESERVED)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "round"]), models.Index(fields=["dataset", "status"])]

    def __str__(self) -> str:
        return f"{self.kind} job {self.job} round {self.round} on dataset {self.dataset_id}: {self.status}"
