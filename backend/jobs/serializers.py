"""Shapes of the job endpoints' requests. Field checks here; the rules of a job in config.py."""

from __future__ import annotations

from rest_framework import serializers

from backend import limits
from backend.jobs.config import DP_MODES
from fl_node.aggregate import available_strategies
from fl_node.models import available_models
from fl_node.sparse import ENCODINGS, PUBLIC_RULES


class DPSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=DP_MODES)
    target_epsilon = serializers.FloatField(
        required=False, allow_null=True, min_value=0.0, max_value=limits.MAX_TARGET_EPSILON
    )
    delta = serializers.FloatField(required=False, default=1e-5, min_value=0.0, max_value=1.0)
    max_grad_norm = serializers.FloatField(required=False, default=1.0, min_value=0.0)

    def validate(self, attrs):
        if attrs["mode"] != "none":
            epsilon = attrs.get("target_epsilon")
            if epsilon is None or epsilon <= 0:
                raise serializers.ValidationError(
                    {"target_epsilon": ["a private job needs a target epsilon > 0"]}
                )
            if not 0 < attrs["delta"] < 1:
                raise serializers.ValidationError({"delta": ["must be between 0 and 1 (exclusive)"]})
            if attrs["max_grad_norm"] <= 0:
                raise serializers.ValidationError({"max_grad_norm": ["must be greater than 0"]})
        return attrs


class SparseSerializer(serializers.Serializer):
    """How trainers encode updates (fl_node.sparse): per tensor and round, dense or a delta array."""

    encoding = serializers.ChoiceField(
        choices=ENCODINGS,
        default="auto",
        help_text="auto: per tensor and round by measured density and cost; dense; delta (every table)",
    )
    link_mbit = serializers.FloatField(
        default=100.0,
        min_value=0.001,
        max_value=limits.MAX_LINK_MBIT,
        help_text="the link (Mbit/s) the cost model assumes",
    )
    tables = serializers.ListField(
        child=serializers.CharField(max_length=limits.MAX_TENSOR_NAME),
        max_length=limits.MAX_SPARSE_TABLES,
        required=False,
        default=list,
        help_text="tensor names that are sparse tables (may go as delta arrays); empty: any of 2+ dims",
    )

    public_rows = serializers.IntegerField(
        min_value=0,
        max_value=limits.MAX_PUBLIC_ROWS,
        default=0,
        help_text="under DP: rows each table keeps per round by a public seeded rule (0: all, dense)",
    )
    public_rule = serializers.ChoiceField(
        choices=PUBLIC_RULES,
        default="rotate",
        help_text="rotate: half the head rows and a seeded draw each round; head: the most frequent rows",
    )

    def validate_tables(self, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("names a tensor twice")
        return sorted(value)


class JobCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=limits.MAX_JOB_NAME)
    model = serializers.ChoiceField(choices=available_models())
    model_options = serializers.DictField(required=False, default=dict)
    dataset = serializers.IntegerField(
        help_text="this node's dataset that defines the schema (input shape, classes)"
    )
    rounds = serializers.IntegerField(min_value=1, max_value=limits.MAX_ROUNDS)
    local_epochs = serializers.IntegerField(min_value=1, max_value=limits.MAX_LOCAL_EPOCHS, default=1)
    batch_size = serializers.IntegerField(min_value=1, max_value=limits.MAX_BATCH_SIZE, default=64)
    lr = serializers.FloatField(min_value=0.0, default=0.1)
    strategy = serializers.ChoiceField(choices=available_strategies(), default="fedavg")
    strategy_params = serializers.DictField(required=False, default=dict)
    dp = DPSerializer()
    sparse = SparseSerializer(required=False)
    committee_size = serializers.IntegerField(
        min_value=1,
        max_value=limits.MAX_COMMITTEE,
        help_text="odd and at least 3 (1, 2 or even sizes only on a development deployment)",
    )
    top_k = serializers.IntegerField(min_value=1, max_value=limits.MAX_TOP_K)
    margin_bp = serializers.IntegerField(
        min_value=0,
        max_value=limits.MAX_MARGIN_BP,
        default=0,
        help_text="basis points an update's median score must beat the current global model's by",
    )
    min_trainers = serializers.IntegerField(
        min_value=1,
        max_value=limits.MAX_PARTICIPANTS - 1,
        help_text="with committee_size, at most max_participants (GET /api/jobs/limits)",
    )
    round_timeout_s = serializers.IntegerField(min_value=1, max_value=limits.MAX_PERIOD_S)
    score_timeout_s = serializers.IntegerField(min_value=1, max_value=limits.MAX_PERIOD_S, required=False)
    join_timeout_s = serializers.IntegerField(
        min_value=1, max_value=limits.MAX_JOIN_TIMEOUT_S, required=False
    )
    val_fraction = serializers.FloatField(min_value=0.01, max_value=0.9, required=False)
    seed = serializers.IntegerField(min_value=0, max_value=limits.MAX_SEED, required=False)
    robust = serializers.BooleanField(
        default=False,
        help_text="committee defenses: clipped relative scores, median-norm clip, sign vote, verified step",
    )
    norm_bound = serializers.FloatField(
        min_value=0.0,
        max_value=limits.NORM_BOUND_BELOW,  # exclusive: validate_norm_bound
        default=0.0,
        help_text="an update above this L2 norm scores 0 and is not aggregated (0: no bound)",
    )
    adaptive_work = serializers.BooleanField(
        default=False,
        help_text="AIMD-adaptive local work: each trainer sets its own steps per round (FedNova aggregation)",
    )
    max_local_steps = serializers.IntegerField(
        min_value=0,
        max_value=limits.MAX_LOCAL_STEPS,
        default=0,
        help_text="with adaptive_work: the most local steps a round may run (at least 4); DP noise is planned for it",
    )

    def validate_lr(self, value: float) -> float:
        if value <= 0:
            raise serializers.ValidationError("must be greater than 0")
        return value

    def validate_norm_bound(self, value: float) -> float:
        if not value < limits.NORM_BOUND_BELOW:
            raise serializers.ValidationError(f"must be below {limits.NORM_BOUND_BELOW:g}")
        return value

    def validate(self, attrs):
        participants = attrs["committee_size"] + attrs["min_trainers"]
        if participants > limits.MAX_PARTICIPANTS:
            raise serializers.ValidationError(
                {
                    "min_trainers": [
                        f"committee_size + min_trainers is {participants}; "
                        f"a job has at most {limits.MAX_PARTICIPANTS} participants"
                    ]
                }
            )
        return attrs


class JoinSerializer(serializers.Serializer):
    dataset = serializers.IntegerField(help_text="this node's dataset (id) that it brings to the job")


class StartSerializer(serializers.Serializer):
    """No fields: the contract draws the first committee from the participants at the start."""

    def validate(self, attrs):
        if isinstance(self.initial_data, dict) and "committee" in self.initial_data:
            raise serializers.ValidationError(
                {
                    "committee": "the first committee is drawn on chain from the participants; it cannot be chosen"
                }
            )
        return attrs


# ----------------------------------------------------------------------------- responses (schema)


class ParticipantPrivacySerializer(serializers.Serializer):
    node = serializers.CharField()
    dataset = serializers.IntegerField(help_text="the participant's dataset id on chain")
    epsilon_spent = serializers.FloatField(
        help_text="this job's released and withheld releases on the dataset"
    )
    epsilon_reserved = serializers.FloatField(help_text="what its reserved releases add on top (local only)")
    # The stubs take this for Field.source (the attribute path), but DRF's serializer metaclass
    # moves declared fields out of the class namespace: nothing is overridden.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=["local", "chain"],
        help_text="local: this node's own records; chain: the participant's PrivacySpent events (unverified)",
    )


class JobPrivacySerializer(serializers.Serializer):
    target_epsilon = serializers.FloatField(allow_null=True)
    delta = serializers.FloatField(allow_null=True, help_text="the job's delta")
    epsilon_max = serializers.FloatField(help_text="the largest epsilon_spent over the participants")
    final = serializers.BooleanField(help_text="the job ended and none of this node's releases is reserved")
    participants = ParticipantPrivacySerializer(many=True)


class ReleaseRecordSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["dp_sgd", "update_gaussian", "score_count"])
    noise_multiplier = serializers.FloatField(help_text="noise std / record-level L2 sensitivity")
    sample_rate = serializers.FloatField()
    steps = serializers.IntegerField()
    delta = serializers.FloatField()
    epsilon_after = serializers.FloatField(
        help_text="the dataset's composed epsilon once this release counted"
    )
    status = serializers.ChoiceField(choices=["reserved", "released", "withheld"])


class JobSerializer(serializers.Serializer):
    """A job as this node sees it on chain (docs/API.md)."""

    id = serializers.IntegerField()
    onchain_id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    current_round = serializers.IntegerField()
    model = serializers.CharField(allow_null=True)
    rounds = serializers.IntegerField()
    local_epochs = serializers.IntegerField(allow_null=True)
    batch_size = serializers.IntegerField(allow_null=True)
    lr = serializers.FloatField(allow_null=True)
    strategy = serializers.CharField(allow_null=True)
    dp = serializers.DictField(allow_null=True)
    committee_size = serializers.IntegerField()
    top_k = serializers.IntegerField()
    min_trainers = serializers.IntegerField()
    round_timeout_s = serializers.IntegerField(allow_null=True)
    score_timeout_s = serializers.IntegerField(allow_null=True)
    input_shape = serializers.ListField(child=serializers.IntegerField(), allow_null=True)
    num_classes = serializers.IntegerField(allow_null=True)
    proposer = serializers.CharField()
    config_hash = serializers.CharField()
    config = serializers.DictField(allow_null=True)
    tx_hash = serializers.CharField(allow_blank=True)
    created = serializers.DateTimeField(allow_null=True)
    participants = serializers.ListField(child=serializers.DictField())
    committee = serializers.ListField(child=serializers.CharField())
    global_model = serializers.DictField(allow_null=True)
    privacy = JobPrivacySerializer()
    contributions = serializers.ListField(
        child=serializers.DictField(),
        help_text="per participant: accepted_updates, accepted_median_sum, updates, reveals, votes, share",
    )
    joined = serializers.DictField(allow_null=True)


class RoundSerializer(serializers.Serializer):
    """A round as the chain's events record it, with this node's own records of it."""

    round = serializers.IntegerField()
    phase = serializers.CharField()
    committee = serializers.ListField(child=serializers.CharField())
    next_committee = serializers.ListField(child=serializers.CharField())
    update_deadline = serializers.IntegerField(allow_null=True)
    score_deadline = serializers.IntegerField(allow_null=True)
    global_model = serializers.DictField(allow_null=True)
    metrics = serializers.DictField(allow_null=True)
    updates = serializers.ListField(child=serializers.DictField())
    transactions = serializers.ListField(child=serializers.DictField())
    timings = serializers.DictField()
    privacy = ReleaseRecordSerializer(many=True, help_text="this node's releases in this round")
    encodings = serializers.DictField(
        help_text="per tensor over the round's updates this node saw (its own, and those it aggregated): "
        "how many came dense and as delta arrays (fl_node.sparse), their mean density, bytes and dense bytes; "
        "each update's own per-tensor record is in updates[].encodings"
    )
