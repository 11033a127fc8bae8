"""A job's configuration: validated, serialized canonically, and turned into training settings.

Plain Python (no Django): the same bytes are stored in the swarm store by the proposer
and fetched and re-checked by every node that joins, so the encoding is canonical
(sorted keys, no whitespace) and ``from_bytes`` refuses anything that does not
re-encode to the same bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from backend.limits import (
    MAX_COMMITTEE,
    MAX_LINK_MBIT,
    MAX_LOCAL_STEPS,
    MAX_PARTICIPANTS,
    MAX_PUBLIC_ROWS,
    MAX_ROUNDS,
    MAX_SCORE,
    MAX_SPARSE_TABLES,
    MAX_TENSOR_NAME,
    MAX_TOP_K,
    MIN_LOCAL_STEPS,
    NORM_BOUND_BELOW,
)
from fl_node.aggregate import get_strategy
from fl_node.models import available_models, create_model
from fl_node.privacy import UpdateGaussianMechanism
from fl_node.privacy_plan import PrivacyPlan, plan_privacy
from fl_node.sparse import ENCODINGS, PUBLIC_RULES, SparsePolicy, public_rows
from fl_node.train import TrainConfig

VERSION = "defl-job/1"
DP_MODES = ("none", "sgd", "update")
SCORE_METRICS = ("accuracy", "likelihood")
# The bounds (MAX_*) are backend.limits': the serializers, the contracts' tests and the API read them too.


class ConfigError(ValueError):
    """A job configuration value is unusable; ``field`` names it (dotted for dp.*)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class DPConfig:
    mode: str = "sgd"
    target_epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0

    @property
    def private(self) -> bool:
        return self.mode != "none"


@dataclass(frozen=True)
class SparseConfig:
    """How trainers encode their updates (fl_node.sparse): dense or delta arrays, chosen per tensor."""

    encoding: str = "auto"  # "auto": by measured density and cost each round; "dense"; "delta"
    link_mbit: float = 100.0  # the link the cost model assumes
    # The sparse tables (tensor names) that may go as delta arrays; empty: any tensor of 2+ dims.
    tables: tuple[str, ...] = ()
    # Under DP, each table keeps this many public rows per round (fl_node.sparse.public_rows), so
    # its noised update is a delta array of those rows; 0 keeps every noised row (dense).
    public_rows: int = 0
    # Which rows (fl_node.sparse.PUBLIC_RULES): "rotate" (half the head, half a seeded draw a round)
    # or "head" (the public_rows most frequent rows of a frequency-sorted vocabulary, every round).
    public_rule: str = "rotate"

    def __post_init__(self) -> None:
        if isinstance(self.tables, list):  # from JSON
            object.__setattr__(self, "tables", tuple(self.tables))

    def policy(self) -> SparsePolicy:
        return SparsePolicy(
            encoding=self.encoding,
            link_bytes_per_s=self.link_mbit * 125_000,
            tables=frozenset(self.tables) or None,
        )


@dataclass(frozen=True)
class JobConfig:
    name: str
    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    schema_hash: str  # the datasets' schema hash: only datasets with this schema may join
    rounds: int
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.5
    strategy: str = "fedavg"
    strategy_params: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    dp: DPConfig = field(default_factory=DPConfig)
    sparse: SparseConfig = field(default_factory=SparseConfig)
    # odd and >= 3 (check_committee_size): smaller only on a development deployment
    committee_size: int = 3
    top_k: int = 3
    # basis points an update's median score must beat the base (current global) model's by
    margin_bp: int = 0
    min_trainers: int = 2
    round_timeout_s: int = 300
    score_timeout_s: int = 120
    join_timeout_s: int = 3600
    val_fraction: float = 0.2
    score_metric: str = "accuracy"
    seed: int = 0
    # AIMD-adaptive local work (backend.jobs.driver.adaptive_work): each trainer sets its own
    # steps per round, at most max_local_steps (nominal: a quarter of it), aggregated by FedNova.
    adaptive_work: bool = False
    max_local_steps: int = 0
    # Defenses against a hostile minority (fl_node.robust, issue 14): committee members score each
    # update relative to the base model at its 1/top_k share, clipped to the round's median norm
    # (fl_node.score.member_scores), and aggregation clips to the median norm of the round's voting
    # submissions, keeps what their sign vote backs and applies k/top_k of a step that accepted k
    # (fl_node.robust.defended_aggregate): what bench/robustness.py measures as "committee".
    robust: bool = False
    # An update whose L2 norm is above this scores 0 and is not aggregated (0: no bound).
    norm_bound: float = 0.0
    version: str = VERSION

    def __post_init__(self) -> None:
        _check(bool(self.name.strip()), "name", "a job needs a name")
        # Registered names only: create_model also imports "package.module:Class" paths, which a
        # configuration fetched from another node must never make this node import and call.
        _check(self.model in available_models(), "model", f"must be one of {', '.join(available_models())}")
        _check(self.rounds >= 1, "rounds", "must be at least 1")
        _check(self.rounds <= MAX_ROUNDS, "rounds", f"must be at most {MAX_ROUNDS}")
        _check(self.local_epochs >= 1, "local_epochs", "must be at least 1")
        _check(self.batch_size >= 1, "batch_size", "must be at least 1")
        _check(_positive(self.lr), "lr", "must be a positive number")
        _check(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        _check(1 <= self.committee_size <= MAX_COMMITTEE, "committee_size", f"must be 1..{MAX_COMMITTEE}")
        _check(1 <= self.top_k <= MAX_TOP_K, "top_k", f"must be 1..{MAX_TOP_K}")
        _check(0 <= self.margin_bp <= MAX_SCORE, "margin_bp", f"must be 0..{MAX_SCORE} basis points")
        _check(1 <= self.min_trainers, "min_trainers", "must be at least 1")
        _check(
            self.min_trainers + self.committee_size <= MAX_PARTICIPANTS,
            "min_trainers",
            f"with the committee, must be at most {MAX_PARTICIPANTS} participants",
        )
        _check(self.round_timeout_s >= 1, "round_timeout_s", "must be at least 1 second")
        _check(self.score_timeout_s >= 1, "score_timeout_s", "must be at least 1 second")
        _check(self.join_timeout_s >= 1, "join_timeout_s", "must be at least 1 second")
        _check(0 < self.val_fraction < 1, "val_fraction", "must be between 0 and 1")
        _check(self.score_metric in SCORE_METRICS, "score_metric", f"must be one of {SCORE_METRICS}")
        _check(isinstance(self.robust, bool), "robust", "must be true or false")
        _check(
            isinstance(self.norm_bound, int | float)
            and not isinstance(self.norm_bound, bool)
            and 0 <= self.norm_bound < NORM_BOUND_BELOW,
            "norm_bound",
            f"must be 0 (no bound) or a positive number below {NORM_BOUND_BELOW:g}",
        )
        _check(self.num_classes >= 2, "num_classes", "a classifier needs at least 2 classes")
        _check(all(d >= 1 for d in self.input_shape) and self.input_shape != (), "input_shape", "bad shape")
        dp = self.dp
        _check(dp.mode in DP_MODES, "dp.mode", f"must be one of {', '.join(DP_MODES)}")
        if dp.private:
            _check(
                dp.target_epsilon is not None and _positive(dp.target_epsilon),
                "dp.target_epsilon",
                "a private job needs a positive target epsilon",
            )
            _check(0 < dp.delta < 1, "dp.delta", "must be between 0 and 1 (exclusive)")
            _check(_positive(dp.max_grad_norm), "dp.max_grad_norm", "must be a positive number")
        _check(self.sparse.encoding in ENCODINGS, "sparse.encoding", f"must be one of {', '.join(ENCODINGS)}")
        _check(
            _positive(self.sparse.link_mbit) and self.sparse.link_mbit <= MAX_LINK_MBIT,
            "sparse.link_mbit",
            f"must be a positive number of Mbit/s, at most {MAX_LINK_MBIT:g}",
        )
        tables = self.sparse.tables
        _check(
            isinstance(tables, tuple)
            and len(tables) <= MAX_SPARSE_TABLES
            and all(isinstance(t, str) and 0 < len(t) <= MAX_TENSOR_NAME for t in tables)
            and list(tables) == sorted(set(tables)),
            "sparse.tables",
            f"must be a sorted list of at most {MAX_SPARSE_TABLES} distinct tensor names",
        )
        public = self.sparse.public_rows
        _check(
            isinstance(public, int) and not isinstance(public, bool) and 0 <= public <= MAX_PUBLIC_ROWS,
            "sparse.public_rows",
            f"must be an integer in [0, {MAX_PUBLIC_ROWS}]",
        )
        _check(
            not public or bool(tables), "sparse.public_rows", "needs sparse.tables: the tables it restricts"
        )
        _check(
            self.sparse.public_rule in PUBLIC_RULES,
            "sparse.public_rule",
            f"must be one of {', '.join(PUBLIC_RULES)}",
        )
        _check(isinstance(self.adaptive_work, bool), "adaptive_work", "must be true or false")
        steps = self.max_local_steps
        if self.adaptive_work:
            _check(
                isinstance(steps, int)
                and not isinstance(steps, bool)
                and MIN_LOCAL_STEPS <= steps <= MAX_LOCAL_STEPS,
                "max_local_steps",
                f"adaptive work needs max_local_steps, an integer in [{MIN_LOCAL_STEPS}, {MAX_LOCAL_STEPS}]",
            )
            _check(self.strategy == "fedavg", "strategy", "adaptive work aggregates by FedNova: use fedavg")
        else:
            _check(steps == 0, "max_local_steps", "only with adaptive_work")
        try:
            get_strategy(self.strategy, **self.strategy_params)
        except ValueError as exc:
            raise ConfigError("strategy", str(exc)) from None

    # ------------------------------------------------------------------ encoding

    def to_bytes(self) -> bytes:
        data = asdict(self)
        if self.sparse == SparseConfig():
            del data["sparse"]  # implied: configurations from before the field keep their bytes
        else:
            for later in ("tables", "public_rows"):  # likewise for the fields added later
                if not data["sparse"][later]:
                    del data["sparse"][later]
            if data["sparse"]["public_rule"] == "rotate":
                del data["sparse"]["public_rule"]
        if not self.adaptive_work:  # likewise
            del data["adaptive_work"], data["max_local_steps"]
        if not self.robust:  # likewise
            del data["robust"]
        if not self.norm_bound:  # likewise
            del data["norm_bound"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    @classmethod
    def from_dict(cls, data: dict) -> JobConfig:
        data = dict(data)
        data["input_shape"] = tuple(data["input_shape"])
        data["dp"] = DPConfig(**data.get("dp", {}))
        sparse = data.get("sparse", {})
        if not isinstance(sparse, dict):
            raise TypeError("sparse must be a mapping")
        data["sparse"] = SparseConfig(**sparse)
        return cls(**data)

    @classmethod
    def from_bytes(cls, blob: bytes) -> JobConfig:
        try:
            config = cls.from_dict(json.loads(blob))
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError("config", f"not a DeFL job configuration: {exc}") from None
        if config.version != VERSION:
            raise ConfigError("version", f"unsupported job configuration version {config.version!r}")
        if config.to_bytes() != bytes(blob):
            raise ConfigError("config", "the job configuration is not in canonical form")
        return config

    def as_dict(self) -> dict:
        return json.loads(self.to_bytes())

    # ------------------------------------------------------------------ derived

    def build_model(self):
        """The job's architecture with the deterministic initial weights (seeded by the config)."""
        return create_model(
            self.model,
            input_shape=self.input_shape,
            num_classes=self.num_classes,
            seed=self.seed,
            **self.model_options,
        )

    def privacy_plan(
        self, *, num_train: int, num_records: int, scores_per_round: int, public_holdout: bool = False
    ) -> PrivacyPlan:
        """This participant's plan for the job: computed once from the config and its own data.

        ``scores_per_round`` is the number of updates a committee member scores in a round
        (participants minus the committee); ``public_holdout``: the dataset declared on chain
        that its hold-out split is public, so its scores are exact and free.
        """
        return plan_privacy(
            mode=self.dp.mode,
            target_epsilon=self.dp.target_epsilon,
            delta=self.dp.delta,
            rounds=self.rounds,
            num_train=num_train,
            num_records=num_records,
            batch_size=self.batch_size,
            epochs=self.local_epochs,
            clip_norm=self.dp.max_grad_norm,
            scores_per_round=scores_per_round,
            public_holdout=public_holdout,
            # Adaptive work: noise calibrated for the most steps a round may run; each round is
            # charged for the steps it ran (fl_node.privacy_plan.train_release).
            max_local_steps=self.max_local_steps if self.adaptive_work else None,
        )

    def train_config(self, seed: int, plan: PrivacyPlan | None = None) -> TrainConfig:
        """Local-training settings; under DP-SGD the noise is the plan's (never re-derived here).

        ``seed`` seeds only what DP does not rely on (dropout, non-private shuffling).
        """
        return TrainConfig(
            batch_size=self.batch_size,
            epochs=self.local_epochs,
            lr=self.lr,
            momentum=self.momentum,
            proximal_mu=float(self.strategy_params.get("mu", 0.0)) if self.strategy == "fedprox" else 0.0,
            noise_multiplier=plan.sgd_noise_multiplier if plan is not None else None,
            delta=self.dp.delta,
            max_grad_norm=self.dp.max_grad_norm,
            rounds=self.rounds,
            seed=seed,
        )

    def kept_rows(self, model_state, round_: int) -> dict | None:
        """The public rows each sparse table keeps in ``round_`` (private jobs with public_rows only)."""
        if not (self.dp.private and self.sparse.public_rows):
            return None
        shapes = {name: tuple(t.shape) for name, t in model_state.items()}
        return public_rows(
            shapes,
            self.sparse.tables,
            self.sparse.public_rows,
            seed=self.seed,
            round_=round_,
            rule=self.sparse.public_rule,
        )

    @staticmethod
    def update_mechanism(plan: PrivacyPlan) -> UpdateGaussianMechanism | None:
        """dp.mode "update": clip each whole update to C and add noise of the plan's std (2C sensitivity)."""
        if plan.train is None or plan.train.kind != "update_gaussian":
            return None
        return UpdateGaussianMechanism(
            clip_norm=plan.clip_norm,
            noise_multiplier=plan.update_noise_std / plan.clip_norm,
            sampling_fraction=1.0,
        )


def _positive(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


COMMITTEE_SIZE_RULE = "committee size must be odd and at least 3"


def check_committee_size(size: int, *, allow_small: bool) -> None:
    """The contract's committee rule: an odd size of at least 3 (a committee of 1 or 2 lets one
    member fix models and carry medians; an even one splits its votes). ``allow_small``: the
    deployment is a development one (FederatedLearning.allowSmallCommittees), where 1..15 pass."""
    _check(1 <= size <= MAX_COMMITTEE, "committee_size", f"must be 1..{MAX_COMMITTEE}")
    if not allow_small:
        _check(size >= 3 and size % 2 == 1, "committee_size", COMMITTEE_SIZE_RULE)


def _check(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ConfigError(field_name, message)
