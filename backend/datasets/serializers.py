"""Shapes of the dataset endpoints. Validation of the form lives here; of the file, in formats."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from backend.datasets import budget, chain, storage
from backend.datasets.models import Dataset, Grant
from fl_node.privacy import ADJACENCIES

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class DatasetUploadSerializer(serializers.Serializer):
    file = serializers.FileField(allow_empty_file=False)
    name = serializers.CharField(max_length=200)
    format = serializers.ChoiceField(choices=Dataset.Format.choices)
    label_column = serializers.CharField(max_length=200, required=False, default="")
    classes = serializers.CharField(
        required=False,
        default="",
        help_text="comma-separated class names in class-id order (required): nodes agree on ids, and the "
        "published schema does not depend on which labels the records hold",
    )
    epsilon_cap = serializers.FloatField(
        min_value=0.0, help_text="privacy budget: total epsilon all jobs may spend"
    )
    delta = serializers.FloatField(min_value=0.0, max_value=1.0, help_text="the delta of (epsilon, delta)-DP")

    public_holdout = serializers.BooleanField(
        required=False,
        default=False,
        help_text="declare (on chain) that committee scores on this dataset's hold-out may be released "
        "exactly: no noise and no charge. The hold-out is one fixed 20% of the records for every job, "
        "never trained on; those records get no privacy from the scores",
    )
    disjoint = serializers.BooleanField(
        required=False,
        default=False,
        help_text="declare (on chain) that this dataset shares no record with any other dataset of this "
        "provider, so it gets a privacy budget of its own; by default a provider's datasets share one "
        "budget (a copy of a dataset, even rescaled or jittered, is the same people's data)",
    )

    def validate_epsilon_cap(self, value: float) -> float:
        if not 0 < value <= chain.MAX_EPSILON_CAP:  # NaN fails too
            raise serializers.ValidationError(
                f"must be greater than 0 and at most {chain.MAX_EPSILON_CAP:g} (the chain refuses larger caps)"
            )
        return value

    def validate_delta(self, value: float) -> float:
        if not 0 < value < 1:
            raise serializers.ValidationError("must be between 0 and 1 (exclusive)")
        return value

    def validate_classes(self, value: str) -> tuple[str, ...]:
        return tuple(name.strip() for name in value.split(",") if name.strip())

    def validate_file(self, value):
        if value.size > settings.DEFL_MAX_UPLOAD_BYTES:
            raise serializers.ValidationError(
                f"the file exceeds the {settings.DEFL_MAX_UPLOAD_BYTES} byte limit"
            )
        return value

    def validate(self, attrs):
        if attrs["format"] == Dataset.Format.CSV and not attrs["label_column"]:
            raise serializers.ValidationError({"label_column": ["required for a CSV upload"]})
        return attrs


class ReplicationSerializer(serializers.Serializer):
    chunks = serializers.IntegerField(allow_null=True)
    healthy = serializers.IntegerField(allow_null=True, help_text="chunks with R copies on live nodes")
    pinned_here = serializers.BooleanField(allow_null=True)


class JobSpendSerializer(serializers.Serializer):
    job = serializers.CharField()
    epsilon = serializers.FloatField(help_text="this job's own released and withheld releases, composed")
    rounds = serializers.IntegerField(help_text="rounds in which the job released something")


class BudgetSerializer(serializers.Serializer):
    epsilon_cap = serializers.FloatField(help_text="the budget group's cap (its members' smallest)")
    delta = serializers.FloatField(
        help_text="the delta every epsilon here is stated at (the group's smallest)"
    )
    epsilon_spent = serializers.FloatField(help_text="released and withheld releases, composed with RDP")
    epsilon_reserved = serializers.FloatField(help_text="what reserved (not yet settled) releases add on top")
    epsilon_left = serializers.FloatField(help_text="cap minus spent and reserved")
    spent_by_jobs = JobSpendSerializer(many=True)
    budget_group = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="ids of the datasets that share this budget (this provider's datasets not declared "
        "disjoint, and datasets with shared records)",
    )
    adjacency = serializers.ChoiceField(
        choices=list(ADJACENCIES),
        help_text="add-remove when every dataset of the group registered a DP count of its records, "
        "else replace-one (a registered exact size)",
    )
    explanation = serializers.CharField()


class DatasetSerializer(serializers.ModelSerializer):
    replication = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()
    # The on-chain commitment, keyed with the dataset's secret; under its old name too, for the
    # dashboard. The records' plain hash is never shown: it would be a membership oracle.
    content_hash = serializers.CharField(
        source="commitment", read_only=True, help_text="the dataset's keyed commitment (as on chain)"
    )
    owner: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Dataset
        # Never encrypted_reference: it carries the data key.
        fields = [
            "id",
            "name",
            "owner",
            "format",
            "num_samples",
            "records",
            "count_noise_std",
            "num_features",
            "feature_shape",
            "classes",
            "label_column",
            "schema_hash",
            "commitment",
            "content_hash",
            "size_bytes",
            "onchain_id",
            "tx_hash",
            "status",
            "public_holdout",
            "disjoint",
            "replication",
            "budget",
            "created",
        ]
        read_only_fields = fields

    @extend_schema_field(ReplicationSerializer)
    def get_replication(self, dataset: Dataset) -> dict:
        try:
            replication = storage.replication(dataset.encrypted_reference)
        except Exception:  # a listing must not fail because one peer is down; null means "unknown"
            return {"chunks": None, "healthy": None, "pinned_here": None}
        return {
            "chunks": replication.chunks,
            "healthy": replication.healthy,
            "pinned_here": replication.pinned_here,
        }

    @extend_schema_field(BudgetSerializer)
    def get_budget(self, dataset: Dataset) -> dict:
        return budget.budget_summary(dataset)


class GrantRequestSerializer(serializers.Serializer):
    node = serializers.CharField(max_length=42, help_text="the grantee node's chain address (0x…)")


class GrantSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="grantee")

    class Meta:
        model = Grant
        fields = ["node", "tx_hash", "created", "revoked", "revoke_tx_hash"]
        read_only_fields = fields


# The requests' rules beyond single fields, for the schema (registers drf-spectacular extensions).
from backend.datasets import schema  # noqa: E402,F401
