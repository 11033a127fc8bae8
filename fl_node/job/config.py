"""A job's configuration: its fields, the values each may take, and its canonical bytes.

The one definition of a job, read by the node (backend/jobs), the simulator (fl_node.simulate)
and the benchmarks alike. What a round derives from it lives beside it, one module each:
fl_node.job.plan (the privacy plan and the chain's spend bound), fl_node.job.training (the
model, the training settings, the public rows, adaptive work), fl_node.job.scoring (how a
committee member scores) and fl_node.job.aggregation (how the accepted updates are combined).
Its bounds are fl_node.job.limits, the one table.

Plain Python (no Django): the same bytes are stored in the swarm store by the proposer
and fetched and re-checked by every node that joins, so the encoding is canonical
(sorted keys, no whitespace) and ``from_bytes`` refuses anything that does not
re-encode to the same bytes; the on-chain configHash is the swarm reference of these bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from fl_node.aggregate import MAX_SHARE_BP, get_strategy
from fl_node.job.limits import (
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
from fl_node.models import available_models
from fl_node.privacy import ADJACENCIES, REPLACE_ONE
from fl_node.robust import DEFAULT_DEFENSE, DEFAULT_MAX_SHARE_BP, DEFENSES
from fl_node.sparse import ENCODINGS, PUBLIC_RULES, SparsePolicy

VERSION = "defl-job/1"
DP_MODES = ("none", "sgd", "update")
SCORE_METRICS = ("accuracy", "likelihood")
# The bounds (MAX_*) are fl_node.job.limits': the serializers, the contracts' tests and the API read them too.


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
    # The neighbouring relation every charge of the job is computed under (fl_node.privacy).
    # "add-remove" needs every participant's dataset to have registered a DP count of its records
    # (fl_node.dp_count); jobs are created so (the API's default). "replace-one" is what a
    # configuration without the field means: jobs from before it, whose datasets' exact sizes
    # were public.
    adjacency: str = REPLACE_ONE

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
    # AIMD-adaptive local work (fl_node.job.training, backend.jobs.driver.adaptive_work): each trainer sets its own
    # steps per round, at most max_local_steps (nominal: a quarter of it), aggregated by FedNova.
    adaptive_work: bool = False
    max_local_steps: int = 0
    # The defense against a hostile minority (fl_node.robust.DEFENSES; issues 14, 34), what
    # bench/robustness.py measures under the same name. "robust": committee members
    # score each update relative to the base model at its 1/top_k share, clipped to the round's median
    # norm (fl_node.score.member_scores); aggregation clips to the median norm of the round's voting
    # submissions, keeps what their sign vote backs, applies k/top_k of a step that accepted k, and
    # bounds each coordinate of the step by the voting submissions' coordinate median
    # (fl_node.robust.defended_aggregate). "mixing": "robust" with that median taken over the voting
    # submissions' nearest-neighbour mixes (fl_node.robust.nearest_neighbour_mix). "levelled" (the
    # default): "mixing" with zero updates left out of those backers and short ones lengthened to half
    # their median norm first (fl_node.robust.level_norms), so free riders cannot shrink the step, and
    # each coordinate of the step at least 3/4 of that median (fl_node.robust.LEVELLED_STEP_FLOOR).
    # "committee": "robust" without the last bound (issue 14's,
    # a job's former "robust": true). "none": plain scores and the strategy's average of what the
    # committee accepted, only when a job says so.
    defense: str = DEFAULT_DEFENSE
    # No update's share of a sample-weighted aggregate above this many basis points, whatever samples
    # it claims (fl_node.aggregate.bounded_weights; 10000: no cap). Every defense keeps it.
    max_share_bp: int = DEFAULT_MAX_SHARE_BP
    # An update whose L2 norm is above this scores 0 and is not aggregated (0: no bound).
    norm_bound: float = 0.0
    version: str = VERSION

    def __post_init__(self) -> None:
        _check_model(self)
        _check_training(self)
        _check_committee(self)
        _check_periods(self)
        _check_dp(self.dp)
        _check_sparse(self.sparse)
        _check_adaptive_work(self)

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
        if self.dp.adjacency == REPLACE_ONE:  # likewise
            del data["dp"]["adjacency"]
        # The defense: "none" and "committee" keep the bytes they had before the field (no key; the
        # former "robust": true), the others name it. One spelling per value, so bytes stay canonical.
        defense = data.pop("defense")
        if defense == "committee":
            data["robust"] = True
        elif defense != "none":
            data["defense"] = defense
        if self.max_share_bp == MAX_SHARE_BP:  # no cap: likewise
            del data["max_share_bp"]
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
        if "robust" in data:  # a "committee" defense's bytes (see to_bytes)
            if data.pop("robust") is not True or "defense" in data:
                raise ValueError('"robust" may only be true, and never beside "defense"')
            data["defense"] = "committee"
        data.setdefault("defense", "none")  # no key: the bytes of "none" (and of configs before the field)
        data.setdefault("max_share_bp", MAX_SHARE_BP)
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


# ------------------------------------------------------------------ the values each field may take


def _check_model(job: JobConfig) -> None:
    _check(bool(job.name.strip()), "name", "a job needs a name")
    # Registered names only: create_model also imports "package.module:Class" paths, which a
    # configuration fetched from another node must never make this node import and call.
    _check(job.model in available_models(), "model", f"must be one of {', '.join(available_models())}")
    _check(job.num_classes >= 2, "num_classes", "a classifier needs at least 2 classes")
    _check(all(d >= 1 for d in job.input_shape) and job.input_shape != (), "input_shape", "bad shape")


def _check_training(job: JobConfig) -> None:
    _check(job.rounds >= 1, "rounds", "must be at least 1")
    _check(job.rounds <= MAX_ROUNDS, "rounds", f"must be at most {MAX_ROUNDS}")
    _check(job.local_epochs >= 1, "local_epochs", "must be at least 1")
    _check(job.batch_size >= 1, "batch_size", "must be at least 1")
    _check(_positive(job.lr), "lr", "must be a positive number")
    _check(0 <= job.momentum < 1, "momentum", "must be in [0, 1)")
    _check(0 < job.val_fraction < 1, "val_fraction", "must be between 0 and 1")
    try:
        get_strategy(job.strategy, **job.strategy_params)
    except ValueError as exc:
        raise ConfigError("strategy", str(exc)) from None


def _check_committee(job: JobConfig) -> None:
    _check(1 <= job.committee_size <= MAX_COMMITTEE, "committee_size", f"must be 1..{MAX_COMMITTEE}")
    _check(1 <= job.top_k <= MAX_TOP_K, "top_k", f"must be 1..{MAX_TOP_K}")
    _check(0 <= job.margin_bp <= MAX_SCORE, "margin_bp", f"must be 0..{MAX_SCORE} basis points")
    _check(1 <= job.min_trainers, "min_trainers", "must be at least 1")
    _check(
        job.min_trainers + job.committee_size <= MAX_PARTICIPANTS,
        "min_trainers",
        f"with the committee, must be at most {MAX_PARTICIPANTS} participants",
    )
    _check(job.score_metric in SCORE_METRICS, "score_metric", f"must be one of {SCORE_METRICS}")
    _check(
        isinstance(job.defense, str) and job.defense in DEFENSES,
        "defense",
        f"must be one of {', '.join(DEFENSES)} (none: no defense, an explicit choice)",
    )
    _check(
        type(job.max_share_bp) is int and 1 <= job.max_share_bp <= MAX_SHARE_BP,
        "max_share_bp",
        f"must be an integer number of basis points in [1, {MAX_SHARE_BP}]",
    )
    _check(
        isinstance(job.norm_bound, int | float)
        and not isinstance(job.norm_bound, bool)
        and 0 <= job.norm_bound < NORM_BOUND_BELOW,
        "norm_bound",
        f"must be 0 (no bound) or a positive number below {NORM_BOUND_BELOW:g}",
    )


def _check_periods(job: JobConfig) -> None:
    _check(job.round_timeout_s >= 1, "round_timeout_s", "must be at least 1 second")
    _check(job.score_timeout_s >= 1, "score_timeout_s", "must be at least 1 second")
    _check(job.join_timeout_s >= 1, "join_timeout_s", "must be at least 1 second")


def _check_dp(dp: DPConfig) -> None:
    _check(dp.mode in DP_MODES, "dp.mode", f"must be one of {', '.join(DP_MODES)}")
    _check(dp.adjacency in ADJACENCIES, "dp.adjacency", f"must be one of {', '.join(ADJACENCIES)}")
    if dp.private:
        _check(
            dp.target_epsilon is not None and _positive(dp.target_epsilon),
            "dp.target_epsilon",
            "a private job needs a positive target epsilon",
        )
        _check(0 < dp.delta < 1, "dp.delta", "must be between 0 and 1 (exclusive)")
        _check(_positive(dp.max_grad_norm), "dp.max_grad_norm", "must be a positive number")


def _check_sparse(sparse: SparseConfig) -> None:
    _check(sparse.encoding in ENCODINGS, "sparse.encoding", f"must be one of {', '.join(ENCODINGS)}")
    _check(
        _positive(sparse.link_mbit) and sparse.link_mbit <= MAX_LINK_MBIT,
        "sparse.link_mbit",
        f"must be a positive number of Mbit/s, at most {MAX_LINK_MBIT:g}",
    )
    tables = sparse.tables
    _check(
        isinstance(tables, tuple)
        and len(tables) <= MAX_SPARSE_TABLES
        and all(isinstance(t, str) and 0 < len(t) <= MAX_TENSOR_NAME for t in tables)
        and list(tables) == sorted(set(tables)),
        "sparse.tables",
        f"must be a sorted list of at most {MAX_SPARSE_TABLES} distinct tensor names",
    )
    public = sparse.public_rows
    _check(
        isinstance(public, int) and not isinstance(public, bool) and 0 <= public <= MAX_PUBLIC_ROWS,
        "sparse.public_rows",
        f"must be an integer in [0, {MAX_PUBLIC_ROWS}]",
    )
    _check(not public or bool(tables), "sparse.public_rows", "needs sparse.tables: the tables it restricts")
    _check(
        sparse.public_rule in PUBLIC_RULES, "sparse.public_rule", f"must be one of {', '.join(PUBLIC_RULES)}"
    )


def _check_adaptive_work(job: JobConfig) -> None:
    _check(isinstance(job.adaptive_work, bool), "adaptive_work", "must be true or false")
    steps = job.max_local_steps
    if job.adaptive_work:
        _check(
            isinstance(steps, int)
            and not isinstance(steps, bool)
            and MIN_LOCAL_STEPS <= steps <= MAX_LOCAL_STEPS,
            "max_local_steps",
            f"adaptive work needs max_local_steps, an integer in [{MIN_LOCAL_STEPS}, {MAX_LOCAL_STEPS}]",
        )
        _check(job.strategy == "fedavg", "strategy", "adaptive work aggregates by FedNova: use fedavg")
    else:
        _check(steps == 0, "max_local_steps", "only with adaptive_work")
