"""Shapes of the job endpoints' requests. Field checks here; the rules of a job in config.py."""

from __future__ import annotations

import re

from django.core.validators import RegexValidator
from rest_framework import serializers

from backend.api.schema import MAX_RECORD_ID
from fl_node.aggregate import MAX_SHARE_BP, available_strategies
from fl_node.job import limits
from fl_node.job.config import DP_MODES
from fl_node.job.limits import MAX_CLIP_NORM, MAX_LR, MIN_DELTA
from fl_node.models import available_models
from fl_node.privacy import ADD_REMOVE, ADJACENCIES, RELEASE_KINDS
from fl_node.robust import DEFAULT_DEFENSE, DEFAULT_MAX_SHARE_BP, DEFENSES
from fl_node.sparse import ENCODINGS, PUBLIC_RULES

# A job is joined with a dataset, and no dataset may join a job without DP (it would spend an
# unbounded budget): the API creates private jobs only. "none" stays a mode of the simulator.
API_DP_MODES = tuple(mode for mode in DP_MODES if mode != "none")
# A sparse table's name: a model's parameter path ("embedding.weight"); anchored for the schema.
TENSOR_NAME_CHARS = r"[A-Za-z0-9_.]+"
TENSOR_NAME = rf"^{TENSOR_NAME_CHARS}$"


class DPSerializer(serializers.Serializer):
    """A job's differential privacy: its mode, target epsilon, delta and clip norm (all checked here;
    delta against the dataset's size, and epsilon against its budget, by the create flow: 409)."""

    mode = serializers.ChoiceField(choices=API_DP_MODES)
    target_epsilon = serializers.FloatField(min_value=0.0, max_value=limits.MAX_TARGET_EPSILON)
    delta = serializers.FloatField(
        required=False,
        default=1e-5,
        min_value=MIN_DELTA,
        max_value=1.0,
        help_text="at most 1/(10 n) for the n records of every dataset that joins (a 409 at create for this "
        "node's dataset); below 1, at least 1e-30",
    )
    max_grad_norm = serializers.FloatField(
        required=False, default=1.0, min_value=0.0, max_value=MAX_CLIP_NORM
    )
    adjacency = serializers.ChoiceField(
        choices=list(ADJACENCIES),
        required=False,
        default=ADD_REMOVE,
        help_text="the neighbouring datasets every charge is computed under: add-remove (every dataset "
        "registered a DP count of its records) or replace-one (also open to datasets registered with "
        "their exact size, at a higher charge for the same noise)",
    )

    def validate_target_epsilon(self, value: float) -> float:
        if not value > 0:
            raise serializers.ValidationError("a private job needs a target epsilon > 0")
        return value

    def validate_delta(self, value: float) -> float:
        if not value < 1:
            raise serializers.ValidationError("must be below 1")
        return value

    def validate_max_grad_norm(self, value: float) -> float:
        if not value > 0:
            raise serializers.ValidationError("must be greater than 0")
        return value


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
        # A tensor name (a model's parameter path): not trimmed, so what the schema's pattern
        # allows is what is checked (str.strip would blank a name of control characters).
        child=serializers.CharField(
            max_length=limits.MAX_TENSOR_NAME,
            trim_whitespace=False,
            validators=[RegexValidator(TENSOR_NAME, "a tensor name: letters, digits, '_' and '.'")],
        ),
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
        # The pattern's "$" (as JSON Schema reads it) ends the string; Python's also allows a
        # final newline, so the whole name is matched here.
        if not all(re.fullmatch(TENSOR_NAME_CHARS, name) for name in value):
            raise serializers.ValidationError("a tensor name holds letters, digits, '_' and '.' only")
        if len(set(value)) != len(value):
            raise serializers.ValidationError("names a tensor twice")
        return sorted(value)


class JobCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=limits.MAX_JOB_NAME)
    model = serializers.ChoiceField(choices=available_models())
    model_options = serializers.DictField(required=False, default=dict)
    dataset = serializers.IntegerField(
        min_value=1,
        max_value=MAX_RECORD_ID,
        help_text="this node's dataset that defines the schema (input shape, classes); this node joins "
        "with it, so its delta, budget and schema are checked before the job goes on chain",
    )
    rounds = serializers.IntegerField(min_value=1, max_value=limits.MAX_ROUNDS)
    local_epochs = serializers.IntegerField(min_value=1, max_value=limits.MAX_LOCAL_EPOCHS, default=1)
    batch_size = serializers.IntegerField(min_value=1, max_value=limits.MAX_BATCH_SIZE, default=64)
    lr = serializers.FloatField(min_value=0.0, max_value=MAX_LR, default=0.1)
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
        # Any committee (at most MAX_COMMITTEE) plus this stays within max_participants, so the
        # bound needs no other field (the schema cannot state a sum).
        max_value=limits.MAX_PARTICIPANTS - limits.MAX_COMMITTEE,
        help_text="at most max_participants - max_committee (GET /api/jobs/limits); and no more than "
        "the members that can join minus the committee (a 409 otherwise)",
    )
    round_timeout_s = serializers.IntegerField(min_value=1, max_value=limits.MAX_PERIOD_S)
    score_timeout_s = serializers.IntegerField(min_value=1, max_value=limits.MAX_PERIOD_S, required=False)
    join_timeout_s = serializers.IntegerField(
        min_value=1, max_value=limits.MAX_JOIN_TIMEOUT_S, required=False
    )
    val_fraction = serializers.FloatField(min_value=0.01, max_value=0.9, required=False)
    seed = serializers.IntegerField(min_value=0, max_value=limits.MAX_SEED, required=False)
    defense = serializers.ChoiceField(
        choices=list(DEFENSES),
        default=DEFAULT_DEFENSE,
        help_text=(
            "the job's defense against a hostile minority: robust (the default: the committee's "
            "defenses and each step bounded by the median of the round's updates), committee "
            "(clipped relative scores, median-norm clip, sign vote, verified step), none (no defense: "
            "an explicit choice)"
        ),
    )
    max_share_bp = serializers.IntegerField(
        min_value=1,
        max_value=MAX_SHARE_BP,
        default=DEFAULT_MAX_SHARE_BP,
        help_text="no update's share of a sample-weighted aggregate above this, in basis points (10000: no cap)",
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


class JoinSerializer(serializers.Serializer):
    dataset = serializers.IntegerField(
        min_value=1, max_value=MAX_RECORD_ID, help_text="this node's dataset (id) that it brings to the job"
    )


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
        help_text="the participant's own epsilon in this job at the job's delta, recomputed from public "
        "records alone: its plan (the job's config, its dataset's size and hold-out flag on chain) over "
        "the releases it recorded on chain (PrivacySpent: published and withheld updates, scores). "
        "Every member shows the same figure"
    )
    epsilon_local = serializers.FloatField(
        required=False,
        help_text="this node only: the same figure from its own records (it differs only if a release "
        "could not be recorded on chain)",
    )
    epsilon_reserved = serializers.FloatField(help_text="what its reserved releases add on top (local only)")
    # The stubs take this for Field.source (the attribute path), but DRF's serializer metaclass
    # moves declared fields out of the class namespace: nothing is overridden.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=["chain", "legacy", "unplannable"],
        help_text="chain: recomputed from the chain's records (any member can check it); legacy: a job "
        "recorded before spends carried their kind, which the chain's records cannot recompute (this "
        "node's own figure is epsilon_local); unplannable: the participant's dataset as registered "
        "(its declared size puts the job's delta above 1/(10 n)) admits no privacy plan, so no "
        "epsilon bounds its releases (epsilon_spent 0 means none is known; no honest node joins so)",
    )


class JobPrivacySerializer(serializers.Serializer):
    target_epsilon = serializers.FloatField(allow_null=True)
    delta = serializers.FloatField(allow_null=True, help_text="the job's delta")
    epsilon_max = serializers.FloatField(
        help_text="the largest epsilon over the participants (epsilon_spent, or this node's epsilon_local)"
    )
    final = serializers.BooleanField(help_text="the job ended and none of this node's releases is reserved")
    participants = ParticipantPrivacySerializer(many=True)


class ReleaseRecordSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=list(RELEASE_KINDS))
    noise_multiplier = serializers.FloatField(help_text="noise std / record-level L2 sensitivity")
    sample_rate = serializers.FloatField()
    steps = serializers.IntegerField()
    delta = serializers.FloatField()
    epsilon_after = serializers.FloatField(
        help_text="the dataset's composed epsilon once this release counted"
    )
    status = serializers.ChoiceField(choices=["reserved", "released", "withheld"])


class ParticipantSerializer(serializers.Serializer):
    node = serializers.CharField(help_text="the member's address")
    name = serializers.CharField(allow_blank=True, help_text="the member's registered name")
    dataset = serializers.IntegerField(help_text="the dataset's id on chain")
    dataset_name = serializers.CharField(allow_blank=True, help_text="its name, for this node's own dataset")
    index = serializers.IntegerField()


class JoinedSerializer(serializers.Serializer):
    dataset = serializers.IntegerField(help_text="this node's dataset (its id on this node)")
    dataset_name = serializers.CharField()
    onchain_dataset = serializers.IntegerField(allow_null=True, help_text="the same dataset's id on chain")
    tx_hash = serializers.CharField(allow_blank=True)
    prepared = serializers.BooleanField(help_text="the first round is ready here")


class TransactionSerializer(serializers.Serializer):
    name = serializers.CharField(
        help_text="the transaction's first event (JobProposed, ScoresSubmitted, ...)"
    )
    tx_hash = serializers.CharField()
    block = serializers.IntegerField()
    actor = serializers.CharField(allow_blank=True, help_text="the member the event names as acting")
    gas = serializers.IntegerField(allow_null=True, help_text="gas used (its receipt); null until read")


class JobGasSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="gas of every transaction of the job whose receipt was read")
    transactions = serializers.IntegerField()
    unknown = serializers.IntegerField(help_text="transactions whose receipt is not read yet")
    setup = TransactionSerializer(
        many=True, help_text="transactions outside any round: proposal, joins, start"
    )


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
    proposer_name = serializers.CharField(allow_blank=True)
    names = serializers.DictField(
        child=serializers.CharField(allow_blank=True), help_text="registered names of the nodes on this page"
    )
    margin_bp = serializers.IntegerField(
        help_text="basis points an update's median must beat the base model's by"
    )
    join_deadline = serializers.IntegerField(help_text="Unix time (the chain's clock) joining closes")
    config_hash = serializers.CharField()
    config = serializers.DictField(allow_null=True)
    tx_hash = serializers.CharField(allow_blank=True)
    created = serializers.DateTimeField(allow_null=True)
    participants = ParticipantSerializer(many=True)
    committee = serializers.ListField(child=serializers.CharField())
    global_model = serializers.DictField(allow_null=True)
    privacy = JobPrivacySerializer()
    contributions = serializers.ListField(
        child=serializers.DictField(),
        help_text="per participant: accepted_updates, accepted_median_sum, updates, reveals, votes, share",
    )
    gas = JobGasSerializer(allow_null=True, help_text="on GET /api/jobs/{id} only (null in the list)")
    joined = JoinedSerializer(allow_null=True)


class DecisionSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=["accepted", "rejected", "pending"])
    reason = serializers.CharField(help_text="why, in the committee rule's terms, as a sentence")
    threshold = serializers.IntegerField(
        allow_null=True, help_text="basis points the median had to beat: base median + margin"
    )


class UpdateSerializer(serializers.Serializer):
    trainer = serializers.CharField()
    index = serializers.IntegerField()
    reference = serializers.CharField()
    content_hash = serializers.CharField()
    samples = serializers.IntegerField()
    scores = serializers.DictField(child=serializers.IntegerField(), help_text="member -> basis points")
    median = serializers.IntegerField(allow_null=True, help_text="basis points")
    rank = serializers.IntegerField(allow_null=True)
    accepted = serializers.BooleanField(allow_null=True, help_text="null until the round is finalized")
    decision = DecisionSerializer()
    tx_hash = serializers.CharField(allow_blank=True)
    block = serializers.IntegerField(allow_null=True)
    encodings = serializers.DictField()


class RoundSerializer(serializers.Serializer):
    """A round as the chain's events record it, each decision with its reason, with this node's own records."""

    round = serializers.IntegerField()
    phase = serializers.CharField()
    base_median = serializers.IntegerField(
        allow_null=True,
        help_text="the median of the committee's scores of the unchanged model (basis points)",
    )
    base_scores = serializers.DictField(
        child=serializers.IntegerField(), help_text="member -> its score of the unchanged model"
    )
    margin = serializers.IntegerField(help_text="basis points a median must beat the base median by")
    top_k = serializers.IntegerField(help_text="at most this many updates are accepted")
    gas = serializers.IntegerField(help_text="gas of the round's transactions whose receipt was read")
    committee = serializers.ListField(child=serializers.CharField())
    next_committee = serializers.ListField(child=serializers.CharField())
    update_deadline = serializers.IntegerField(allow_null=True)
    score_deadline = serializers.IntegerField(allow_null=True)
    global_model = serializers.DictField(allow_null=True)
    metrics = serializers.DictField(allow_null=True)
    updates = UpdateSerializer(many=True)
    transactions = TransactionSerializer(many=True)
    timings = serializers.DictField()
    privacy = ReleaseRecordSerializer(many=True, help_text="this node's releases in this round")
    encodings = serializers.DictField(
        help_text="per tensor over the round's updates this node saw (its own, and those it aggregated): "
        "how many came dense and as delta arrays (fl_node.sparse), their mean density, bytes and dense bytes; "
        "each update's own per-tensor record is in updates[].encodings"
    )


# The request's schema beyond single fields (registers drf-spectacular extensions on import).
from backend.jobs_api import request_schema  # noqa: E402,F401
