"""Shapes of the job endpoints' responses that are not a plain job or round (OpenAPI schema only).

Kept apart from serializers.py (requests and the job/round shapes) so that the schema of each
response is stated once: schemathesis checks every response against it (tests/backend/test_schemathesis.py).
"""

from __future__ import annotations

from rest_framework import serializers

from backend.jobs.serializers import JobSerializer


class JobStartedSerializer(JobSerializer):
    """The job after ``startJob``, and the transaction that started it."""

    start_tx_hash = serializers.CharField(help_text="the startJob transaction (0x-hex)")


class JobCancelledSerializer(JobSerializer):
    """The job after ``cancelJob``, and the transaction that cancelled it."""

    cancel_tx_hash = serializers.CharField(help_text="the cancelJob transaction (0x-hex)")


class CommitteeRoundSerializer(serializers.Serializer):
    """The committee seated for one round, in seat order."""

    round = serializers.IntegerField()
    members = serializers.ListField(child=serializers.CharField(), help_text="member addresses by seat")
