"""The model registry: every global model version this node knows of, one per (job, round)."""

from django.db import models


class GlobalModel(models.Model):
    job = models.CharField(max_length=80, help_text="the job's on-chain id")
    round = models.PositiveIntegerField()
    # How to rebuild the module: fl_node.models.create_model(architecture, input_shape=..., num_classes=..., **options)
    architecture = models.CharField(max_length=200)
    options = models.JSONField(default=dict, blank=True)
    input_shape = models.JSONField(help_text="shape of one input sample, e.g. [784] or [1, 28, 28]")
    num_classes = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64, help_text="SHA-256 hex of the safetensors bytes")
    onchain_hash = models.CharField(max_length=66, blank=True, help_text="the hash the contract fixed")
    reference = models.CharField(max_length=128, help_text="swarm reference of the safetensors bytes")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [models.UniqueConstraint(fields=["job", "round"], name="one_global_model_per_round")]
        indexes = [models.Index(fields=["job", "-round"])]

    def __str__(self) -> str:
        return f"job {self.job} round {self.round}"
