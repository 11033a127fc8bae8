"""Datasets this node provides, the grants it issued, and the privacy budget spent on them.

The encrypted swarm reference is the dataset's data key (it carries the decryption
key), so it never leaves this node in the clear: the API never returns it, and a
grant carries it only wrapped for the grantee's public key.
"""

from django.conf import settings
from django.db import models


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
    num_samples = models.PositiveIntegerField()
    feature_shape = models.JSONField(help_text="shape of one sample, e.g. [784] or [1, 28, 28]")
    num_features = models.PositiveIntegerField()
    classes = models.JSONField(help_text="class names in class-id order")
    label_column = models.CharField(max_length=200, blank=True)
    schema_hash = models.CharField(max_length=64)
    content_hash = models.CharField(max_length=64, unique=True)
    size_bytes = models.PositiveBigIntegerField(help_text="size of the canonical (plaintext) dataset")
    # Secret: the encrypted reference with its key. Never serialized to the API.
    encrypted_reference = models.CharField(max_length=512)
    status = models.CharField(max_length=16, choices=Status.choices)
    onchain_id = models.CharField(max_length=80, blank=True)
    tx_hash = models.CharField(max_length=80, blank=True)
    epsilon_cap = models.FloatField()
    delta = models.FloatField()
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


class BudgetSpend(models.Model):
    """What one job spent on a dataset: its DP mechanism runs, composed by the RDP accountant.

    The history (fl_node.privacy.PrivacyHistory JSON: [[noise_multiplier, sample_rate,
    steps], ...]) is kept rather than an epsilon, because epsilons of separate runs
    do not add up; histories compose exactly.
    """

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="spends")
    job = models.CharField(max_length=80)
    history = models.TextField(default="[]")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "job"], name="one_spend_per_job")]
