"""Shapes of the job endpoints' responses that are not a plain job or round (OpenAPI schema only).

Kept apart from serializers.py (requests and the job/round shapes) so that the schema of each
response is stated once: schemathesis checks every response against it (tests/backend/test_schemathesis.py).
"""

from __future__ import annotations

from rest_framework import serializers

from backend.jobs_api.serializers import JobSerializer


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


class JobLimitsSerializer(serializers.Serializer):
    """The bounds of a job's fields (fl_node.job.limits): what ``POST /api/jobs`` and the contract accept."""

    max_rounds = serializers.IntegerField(help_text="rounds: 1..max_rounds (FederatedLearning.MAX_ROUNDS)")
    max_local_epochs = serializers.IntegerField()
    max_batch_size = serializers.IntegerField()
    max_committee = serializers.IntegerField(
        help_text="committee_size: 1..max_committee (odd, >= 3 in production)"
    )
    max_top_k = serializers.IntegerField()
    max_participants = serializers.IntegerField(help_text="committee_size + min_trainers at most this")
    max_margin_bp = serializers.IntegerField(help_text="margin_bp: 0..max_margin_bp basis points")
    max_period_s = serializers.IntegerField(help_text="round_timeout_s and score_timeout_s at most this")
    max_join_timeout_s = serializers.IntegerField()
    max_target_epsilon = serializers.FloatField(
        help_text="dp.target_epsilon at most this (the largest dataset cap)"
    )
    max_epsilon_cap = serializers.FloatField(help_text="a dataset's epsilon_cap at most this")
    min_local_steps = serializers.IntegerField(help_text="max_local_steps at least this with adaptive_work")
    max_local_steps = serializers.IntegerField()
    max_sparse_tables = serializers.IntegerField()
    max_public_rows = serializers.IntegerField()
    max_link_mbit = serializers.FloatField()
    max_job_name = serializers.IntegerField(help_text="characters")
    max_seed = serializers.IntegerField()
    max_lr = serializers.FloatField(help_text="lr: above 0, at most max_lr")
    max_upload_bytes = serializers.IntegerField(
        help_text="a dataset upload's largest size (DEFL_MAX_UPLOAD_BYTES)"
    )
