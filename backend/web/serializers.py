"""Shapes of the dashboard's read endpoints (backend.web.summary computes them), for the schema.

Each answer is serialized through these, so what the schema says is what the endpoint sends
(tests/backend/test_schemathesis.py checks every answer against it).
"""

from __future__ import annotations

from rest_framework import serializers

from backend.nodes.serializers import NodeSerializer, StorageSerializer


class OverviewJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField(allow_blank=True)
    status = serializers.CharField()
    phase = serializers.CharField(help_text="the latest round's phase, 'scoring' split off training")
    current_round = serializers.IntegerField()
    rounds = serializers.IntegerField()
    participants = serializers.IntegerField()
    needed = serializers.IntegerField(help_text="committee_size + min_trainers")
    proposer = serializers.CharField()
    proposer_name = serializers.CharField(allow_blank=True)
    mine = serializers.BooleanField(help_text="this node proposed it")
    joined = serializers.BooleanField()
    prepared = serializers.BooleanField()
    latest_accuracy = serializers.FloatField(allow_null=True)
    latest_metric_round = serializers.IntegerField(allow_null=True)


class OverviewChainSerializer(serializers.Serializer):
    available = serializers.BooleanField()
    block = serializers.IntegerField(allow_null=True)
    indexed_block = serializers.IntegerField(allow_null=True)
    lag = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class DashboardReplicationSerializer(serializers.Serializer):
    available = serializers.BooleanField()
    factor = serializers.IntegerField(allow_null=True)
    nodes = serializers.IntegerField(allow_null=True)
    up = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class WarningSerializer(serializers.Serializer):
    kind = serializers.CharField()
    level = serializers.ChoiceField(choices=["error", "warning", "info"])
    text = serializers.CharField(help_text="a sentence")


class OverviewSerializer(serializers.Serializer):
    address = serializers.CharField(allow_null=True)
    node = NodeSerializer()
    jobs = OverviewJobSerializer(many=True)
    chain = OverviewChainSerializer()
    storage = StorageSerializer()
    replication = DashboardReplicationSerializer()
    warnings = WarningSerializer(many=True)


class CandidateDatasetSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="the dataset's id on chain")
    name = serializers.CharField(allow_blank=True, help_text="its name where this node knows it (its own)")
    owned = serializers.BooleanField()
    samples = serializers.IntegerField()
    schema_hash = serializers.CharField()
    epsilon_cap = serializers.FloatField(allow_null=True)
    epsilon_left = serializers.FloatField(allow_null=True)


class CandidateSerializer(serializers.Serializer):
    address = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    self = serializers.BooleanField(help_text="this node")
    datasets = CandidateDatasetSerializer(many=True)


class JoinCandidatesSerializer(serializers.Serializer):
    address = serializers.CharField(allow_null=True)
    members = CandidateSerializer(many=True)
    allow_small_committees = serializers.BooleanField(
        allow_null=True,
        help_text="the deployment takes committees of 1, 2 or an even size (a development chain); null: unknown",
    )


class GrantedDatasetSerializer(serializers.Serializer):
    dataset = serializers.IntegerField(help_text="the dataset's id on chain")
    owner = serializers.CharField()
    owner_name = serializers.CharField(allow_blank=True)
    samples = serializers.IntegerField()
    epsilon_cap = serializers.FloatField()
    epsilon_spent = serializers.FloatField()
    epsilon_left = serializers.FloatField()
    state = serializers.ChoiceField(choices=["active", "revoked"])
    granted_block = serializers.IntegerField()
    revoked_block = serializers.IntegerField(allow_null=True)


class CatalogModelSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.CharField()
    job_name = serializers.CharField(allow_blank=True)
    round = serializers.IntegerField()
    architecture = serializers.CharField()
    input_shape = serializers.ListField(child=serializers.IntegerField())
    num_classes = serializers.IntegerField()
    content_hash = serializers.CharField()
    onchain_hash = serializers.CharField(allow_blank=True)
    created = serializers.DateTimeField()
    accuracy = serializers.FloatField(allow_null=True, help_text="on this node's validation data")
    loss = serializers.FloatField(allow_null=True)
    served = serializers.BooleanField(help_text="the newest version of its job, the one predictions use")
