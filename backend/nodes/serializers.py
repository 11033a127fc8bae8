"""Request and response shapes of the auth and node endpoints."""

from rest_framework import serializers

from backend.api.query import QuerySerializer
from backend.identity.roles import Role


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, trim_whitespace=False, style={"input_type": "password"})
    device = serializers.CharField(
        max_length=100,
        required=False,
        allow_blank=True,
        help_text="what this login is called in the user's list of logins (default: browser and system)",
    )


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)


class LoginResponseSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="this login's own token: logging out ends it, and only it")
    token_id = serializers.IntegerField(help_text="the token's id in GET /api/tokens")
    expires = serializers.DateTimeField()
    user = MeSerializer()


class ChainSerializer(serializers.Serializer):
    available = serializers.BooleanField()
    chain_id = serializers.IntegerField(allow_null=True)
    block = serializers.IntegerField(allow_null=True)
    indexed_block = serializers.IntegerField(allow_null=True)
    lag = serializers.IntegerField(allow_null=True)
    contracts = serializers.DictField(child=serializers.CharField())
    error = serializers.CharField(allow_null=True)


class StorageSerializer(serializers.Serializer):
    available = serializers.BooleanField()
    chunks = serializers.IntegerField(allow_null=True)
    bytes = serializers.IntegerField(allow_null=True)
    pinned_chunks = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class WorkersSerializer(serializers.Serializer):
    broker = serializers.CharField(allow_null=True, help_text="broker host, or null for in-process tasks")
    eager = serializers.BooleanField()


class NodeSerializer(serializers.Serializer):
    address = serializers.CharField(allow_null=True, help_text="this node's chain address (null: no key yet)")
    name = serializers.CharField()
    endpoint = serializers.CharField(allow_blank=True)
    overlay = serializers.CharField(allow_null=True)
    identity_error = serializers.CharField(allow_null=True)
    chain = ChainSerializer()
    storage = StorageSerializer()
    workers = WorkersSerializer()
    device = serializers.CharField()


class PeerSerializer(serializers.Serializer):
    address = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    endpoint = serializers.CharField(allow_blank=True)
    overlay = serializers.CharField(allow_null=True)
    healthy = serializers.BooleanField(allow_null=True)
    last_seen = serializers.DateTimeField(allow_null=True)


class EventSerializer(serializers.Serializer):
    name = serializers.CharField(allow_blank=True, help_text="blank for a rejected log that was not decoded")
    contract = serializers.CharField(allow_blank=True)
    block = serializers.IntegerField()
    tx_hash = serializers.CharField()
    args = serializers.DictField(help_text="empty for a rejected event")
    timestamp = serializers.DateTimeField(allow_null=True)
    status = serializers.ChoiceField(
        choices=["mirrored", "rejected"],
        help_text="rejected: the indexer could not decode or store it, skipped it and kept indexing",
    )
    reason = serializers.CharField(allow_null=True, help_text="why it was rejected (null when mirrored)")


class EventQuerySerializer(QuerySerializer):
    limit = serializers.IntegerField(min_value=1, max_value=500, default=50)
    status = serializers.ChoiceField(
        choices=["mirrored", "rejected"], required=False, help_text="only events of this status"
    )
