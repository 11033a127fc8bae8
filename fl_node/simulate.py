"""An in-process federation running DeFL's round protocol, for experiments, tests and benchmarks.

Each round follows ../shared/DESIGN.md without the chain and the swarm store: the
trainers (nodes not on the committee) train locally (DP-SGD by default), encode
their updates with the codec, the committee members score every update on their
own validation data, :func:`fl_node.committee.decide_round` (the rule the contract
runs) accepts the best ``top_k`` and elects the next committee, and the accepted
updates are aggregated deterministically into the next global model.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from fl_node.aggregate import WeightedUpdate
from fl_node.attacks import Attack, boost_to_bound, choose_attackers, parse_attack_spec
from fl_node.codec import content_hash, decode_update, update_spec
from fl_node.committee import MAX_SCORE, RoundOutcome, _tie_key, decide_round, score_to_int
from fl_node.data import ArrayDataset, DatasetSplits, load_dataset, map_features
from fl_node.local_round import local_round
from fl_node.models import create_model, split_fixed_features
from fl_node.partition import partition
from fl_node.privacy import PrivacyHistory, ReleasePlan, UpdateGaussianMechanism, prv_epsilon, rdp_epsilon
from fl_node.privacy_plan import PrivacyPlan, plan_privacy
from fl_node.robust import (
    RoundDefense,
    aggregation_clip_norm,
    cap_samples,
    colluding_scores,
    defended_aggregate,
    first_by_hash,
    get_strategy,
    update_norm,
    vote_roles,
    vote_signs,
    within_norm_bound,
)
from fl_node.score import BASE_KEY, BASE_SCORE, member_scores, scaled_update, score_update
from fl_node.secure_random import SecureRandom
from fl_node.sparse import SparsePolicy, encode_with_policy, round_public_rows
from fl_node.train import TrainConfig, evaluate, train_local

DP_MODES = ("sgd", "update")
SCORE_PRIVACY = ("dp", "public")


@dataclass(frozen=True)
class SimulationConfig:
    dataset: str = "mnist"
    nodes: int = 5
    partition: str = "dirichlet:0.5"
    rounds: int = 20
    model: str = "mlp"
    epsilon: float | None = None  # target for the whole job per dataset; None trains without DP
    delta: float = 1e-5
    dp_mode: str = "sgd"  # "sgd": DP-SGD per example; "update": clip + noise each whole update
    committee: int = 2
    top_k: int | None = None  # default: every trainer but one
    strategy: str = "fedavg"
    strategy_params: tuple[tuple[str, float | int], ...] = ()  # (("beta", 0.25),) for trimmed_mean
    attack: str | None = None  # "label_flip:0.2"
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.5
    momentum: float = 0.5
    max_grad_norm: float = 1.0
    proximal_mu: float = 0.0
    update_clip_norm: float = 1.0
    # "dp": committee scores are noisy counts charged to the scorer's budget; "public": every
    # node declared its hold-out public, scores are exact and free.
    score_privacy: str = "dp"
    seed: int = 0
    update_encoding: str = "auto"  # fl_node.sparse: "auto" (per tensor by cost), "dense", "delta"
    # Under DP, each of these sparse tables keeps a public, seeded set of public_rows rows per round,
    # as a node's trainer does (fl_node.sparse.round_public_rows); 0 keeps every noised row.
    sparse_tables: tuple[str, ...] = ()
    public_rows: int = 0
    public_rule: str = "rotate"  # fl_node.sparse.PUBLIC_RULES
    # Robustness (issue 14, fl_node.robust). consensus=False is the undefended FedAvg baseline: no
    # committee, every node trains, every update is averaged as sent with the samples it claims.
    consensus: bool = True
    norm_bound: float | None = None  # an update above this L2 norm scores 0 from honest members
    margin: int | None = None  # None: accept a median above 0; n: beat the base model's median by n
    collude: bool = False  # attackers on the committee score accomplices MAX_SCORE, the others 0
    # "rank": the first committee is nodes 0..committee-1, then the best-ranked trainers (the contract's
    # rule); "random": every committee is drawn uniformly (seeded) from the round's eligible nodes.
    committee_draw: str = "rank"
    # The contract's draws (issue 14): the first committee is the committee_size participants with the
    # smallest keccak(seed, address), and equal medians are ordered by a fresh tie seed each round; the
    # chain's seeds come from its blocks, here from the run's seed. False: nodes 0..committee-1 sit
    # first and ties go by the all-zero tie seed (the fixed seats the older tests are written against).
    chain_draws: bool = False
    # How honest committee members score (fl_node.score): the metric, and the share of the update they
    # apply to the global model before evaluating it (1/top_k: the weight it would get in the average,
    # so a non-IID update is judged by the step it would make, not by a full step on its own).
    score_metric: str = "accuracy"
    score_scale: float = 1.0
    # Relative scores (fl_node.score.relative_score_int): the base model at BASE_SCORE, an update at
    # BASE_SCORE plus its gain. Needs a margin (the rule then reads "gains more than margin").
    score_relative: bool = False
    # The robust learning rate (fl_node.robust.sign_vote_mask) over the round's submissions: None, "flip", "zero".
    sign_vote: str | None = None
    # Honest aggregation clips every accepted update to the median norm of the round's submissions.
    clip_to_median: bool = False
    # Honest members score each update clipped to that median norm (relative scores only): the step
    # the aggregation can apply, not the length an attacker boosted to (fl_node.score.relative_update_score).
    score_clipped: bool = False
    # A round that accepts k < top_k updates applies k / top_k of their combined step: each was
    # scored at a 1 / top_k share (fl_node.robust.verified_share).
    verified_step: bool = False
    # Attackers that know the norm bound scale what they send to just under it (fl_node.attacks.boosts).
    adaptive_attack: bool = False

    def __post_init__(self) -> None:
        SparsePolicy(encoding=self.update_encoding)  # validates early
        if self.nodes < 2:
            raise ValueError(f"a federation needs at least 2 nodes, got {self.nodes}")
        if not 1 <= self.committee < self.nodes:
            raise ValueError(
                f"committee must be between 1 and nodes - 1 ({self.nodes - 1}), got {self.committee}"
            )
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a positive number, got {self.epsilon}")
        if self.dp_mode not in DP_MODES:
            raise ValueError(f"dp_mode must be one of {DP_MODES}, got {self.dp_mode!r}")
        if self.score_privacy not in SCORE_PRIVACY:
            raise ValueError(f"score_privacy must be one of {SCORE_PRIVACY}, got {self.score_privacy!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.norm_bound is not None and not (self.norm_bound > 0 and math.isfinite(self.norm_bound)):
            raise ValueError(f"norm_bound must be a positive number, got {self.norm_bound}")
        if self.margin is not None and not 0 <= self.margin <= MAX_SCORE:
            raise ValueError(f"margin must be in [0, {MAX_SCORE}], got {self.margin}")
        if self.committee_draw not in ("rank", "random"):
            raise ValueError(f"committee_draw must be 'rank' or 'random', got {self.committee_draw!r}")
        if self.score_metric not in ("accuracy", "likelihood"):
            raise ValueError(f"score_metric must be 'accuracy' or 'likelihood', got {self.score_metric!r}")
        if self.score_relative and self.margin is None:
            raise ValueError("relative scores need a margin (0: any gain over the base model)")
        if not 0.0 < self.score_scale <= 1.0:
            raise ValueError(f"score_scale must be in (0, 1], got {self.score_scale}")
        if self.sign_vote not in (None, "flip", "zero"):
            raise ValueError(f"sign_vote must be None, 'flip' or 'zero', got {self.sign_vote!r}")
        parse_attack_spec(self.attack)  # validates early
        get_strategy(self.strategy, **dict(self.strategy_params))

    @property
    def trainers_per_round(self) -> int:
        return self.nodes - self.committee

    @property
    def effective_top_k(self) -> int:
        return self.top_k or max(1, self.trainers_per_round - 1)


@dataclass
class Participant:
    index: int
    address: str
    train: ArrayDataset
    val: ArrayDataset
    attack: Attack | None = None
    # Everything this participant released in the job (training and scores), one RDP history.
    history: PrivacyHistory = field(default_factory=PrivacyHistory)
    score_history: PrivacyHistory = field(default_factory=PrivacyHistory)
    plan: PrivacyPlan | None = None

    def charge(self, release: ReleasePlan | None) -> None:
        if release is None:
            return
        self.history.record(
            noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
        )
        if release.kind == "score_count":
            self.score_history.record(
                noise_multiplier=release.noise_multiplier,
                sample_rate=release.sample_rate,
                steps=release.steps,
            )

    def mechanism(self) -> UpdateGaussianMechanism | None:
        """A fresh update mechanism of this participant's plan (its releases are charged by the caller)."""
        if self.plan is None or self.plan.train is None or self.plan.train.kind != "update_gaussian":
            return None
        return UpdateGaussianMechanism(
            clip_norm=self.plan.clip_norm,
            noise_multiplier=self.plan.update_noise_std / self.plan.clip_norm,
            sampling_fraction=1.0,
        )


@dataclass(frozen=True)
class UpdateRecord:
    trainer: int
    attacker: bool
    median: int
    accepted: bool
    num_samples: int
    content_hash: str
    encoded_bytes: int


@dataclass(frozen=True)
class RoundRecord:
    round: int
    committee: list[int]
    updates: list[UpdateRecord]
    test_accuracy: float
    test_loss: float
    epsilon_rdp: float  # the largest spent by any dataset so far in this job (training and scores)
    epsilon_prv: float
    score_epsilon_rdp: float  # the largest spent on scores alone by any dataset
    seconds: float

    @property
    def attackers_rejected(self) -> bool:
        return all(not u.accepted for u in self.updates if u.attacker)


@dataclass(frozen=True)
class SimulationResult:
    config: SimulationConfig
    rounds: list[RoundRecord]
    attackers: list[int]
    # Each participant's composed releases (training and scores), for an independent audit.
    histories: list[PrivacyHistory] = field(default_factory=list)
    final_state: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def final_accuracy(self) -> float:
        return self.rounds[-1].test_accuracy

    def to_dict(self) -> dict:
        rounds = [asdict(r) | {"attackers_rejected": r.attackers_rejected} for r in self.rounds]
        with_attack = [r for r in self.rounds if any(u.attacker for u in r.updates)]
        rejected = sum(r.attackers_rejected for r in with_attack)
        return {
            "config": asdict(self.config),
            "attackers": self.attackers,
            "final_accuracy": self.final_accuracy,
            "final_epsilon_rdp": self.rounds[-1].epsilon_rdp,
            "final_epsilon_prv": self.rounds[-1].epsilon_prv,
            "attack_rejected_rounds": rejected,
            "attack_rounds": len(with_attack),
            "rounds": rounds,
        }


def prepared_model_and_data(dataset: str, model: str, *, seed: int) -> tuple[DatasetSplits, torch.nn.Module]:
    """The dataset and the trainable model; a fixed feature front-end is applied to the data once.

    See :func:`fl_node.models.split_fixed_features`: the trained mechanism and
    every prediction are the same as with the whole model, only cheaper.
    """
    splits = load_dataset(dataset, seed=seed)
    features, head = split_fixed_features(create_model(model, seed=seed, **splits.model_kwargs()))
    if features is not None:
        key = (dataset, model, seed)  # a model's fixed features depend only on its name
        if key not in _FEATURIZED:
            _FEATURIZED.clear()  # one dataset's features at a time
            _FEATURIZED[key] = map_features(splits, features)
        splits = _FEATURIZED[key]
    return splits, head


_FEATURIZED: dict[tuple[str, str, int], DatasetSplits] = {}


def node_address(seed: int, index: int) -> str:
    """A stable stand-in for a node's chain address."""
    return "0x" + hashlib.sha256(f"defl-sim:{seed}:{index}".encode()).hexdigest()[:40]


def build_participants(config: SimulationConfig, splits: DatasetSplits) -> list[Participant]:
    attack, fraction = parse_attack_spec(config.attack)
    attackers = choose_attackers(config.nodes, fraction, seed=config.seed)
    train_parts = partition(splits.train.y, config.nodes, config.partition, seed=config.seed)
    # Every organization holds a small labelled hold-out set of its own for committee scoring.
    val_parts = partition(splits.val.y, config.nodes, "iid", seed=config.seed + 1)
    participants = [
        Participant(
            index=i,
            address=node_address(config.seed, i),
            train=splits.train.subset(train_parts[i]),
            val=splits.val.subset(val_parts[i]),
            attack=attack if i in attackers else None,
        )
        for i in range(config.nodes)
    ]
    for participant in participants:
        participant.plan = participant_plan(config, participant)
    return participants


def participant_plan(config: SimulationConfig, participant: Participant) -> PrivacyPlan:
    """The participant's privacy plan: one per participant, as each node computes its own."""
    mode = "none" if config.epsilon is None else config.dp_mode
    return plan_privacy(
        mode=mode,
        target_epsilon=config.epsilon,
        delta=config.delta,
        rounds=config.rounds,
        num_train=len(participant.train),
        num_records=len(participant.train) + len(participant.val),
        batch_size=config.batch_size,
        epochs=config.local_epochs,
        clip_norm=config.max_grad_norm if config.dp_mode == "sgd" else config.update_clip_norm,
        scores_per_round=config.trainers_per_round,
        public_holdout=config.score_privacy == "public",
    )


def _train_config(config: SimulationConfig, seed: int, plan: PrivacyPlan | None) -> TrainConfig:
    return TrainConfig(
        batch_size=config.batch_size,
        epochs=config.local_epochs,
        lr=config.lr,
        momentum=config.momentum,
        proximal_mu=config.proximal_mu,
        noise_multiplier=plan.sgd_noise_multiplier if plan else None,
        delta=config.delta,
        max_grad_norm=config.max_grad_norm,
        rounds=config.rounds,
        seed=seed,
    )


def _local_update(
    config: SimulationConfig,
    participant: Participant,
    model: torch.nn.Module,
    global_state: dict[str, torch.Tensor],
    num_classes: int,
    round_index: int,
    secret: bytes | None,
) -> tuple[dict[str, torch.Tensor], int]:
    seed = config.seed * 1_000_003 + round_index * 1009 + participant.index
    plan = participant.plan
    if plan is not None and plan.train is not None:
        participant.charge(plan.train)  # charged before training, as a node does
    result = local_round(
        model,
        global_state,
        participant.train,
        _train_config(config, seed, plan),
        num_classes=num_classes,
        mechanism=participant.mechanism(),
        attack=participant.attack,
        attack_seed=seed,
        randomness=_stream(secret, "train", round_index, participant.index),
        kept_rows=round_public_rows(
            global_state,
            config.sparse_tables,
            config.public_rows,
            private=config.epsilon is not None,
            seed=config.seed,
            round_=round_index + 1,
            rule=config.public_rule,
        ),
    )
    return result.update, result.samples


def _stream(secret: bytes | None, *context: str | int) -> SecureRandom | None:
    """The DP stream of one draw site: derived from the run's secret, or fresh (None)."""
    return SecureRandom.derive(secret, *context) if secret is not None else None


def run_simulation(
    config: SimulationConfig,
    *,
    on_round: Callable[[RoundRecord], None] | None = None,
    randomness_secret: bytes | None = None,
) -> SimulationResult:
    """Run the federation. The DP draws are fresh secret randomness, unless ``randomness_secret``
    (16+ bytes, the experimenter's own) makes a run repeatable: each draw site then derives its
    stream from it (as a node could from a node-local secret)."""
    import time

    torch.manual_seed(config.seed)
    splits, model = prepared_model_and_data(config.dataset, config.model, seed=config.seed)
    _, scratch = prepared_model_and_data(config.dataset, config.model, seed=config.seed)
    # Nodes of an "absent" spec take no part (the honest-only reference); the rest keep their data.
    participants = [p for p in build_participants(config, splits) if not (p.attack and p.attack.absent)]
    if len(participants) <= config.committee:
        raise ValueError(
            f"{len(participants)} nodes take part: not enough for a committee of {config.committee}"
        )
    by_address = {p.address: p for p in participants}
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    spec = update_spec(global_state)
    strategy = get_strategy(config.strategy, **dict(config.strategy_params))
    policy = SparsePolicy(encoding=config.update_encoding)
    server_state = None
    committee = [p.address for p in participants[: config.committee]]
    if config.chain_draws:
        seed = _chain_seed(config, "start")
        committee = sorted((p.address for p in participants), key=lambda a: _tie_key(seed, a))[
            : config.committee
        ]
    if config.committee_draw == "random":
        committee = _draw(config, [p.address for p in participants], 0)
    test_x, test_y = splits.test.tensors()
    records: list[RoundRecord] = []
    for round_index in range(config.rounds):
        started = time.perf_counter()
        if config.consensus:
            trainers = [p for p in participants if p.address not in committee]
        else:
            trainers = list(participants)
        # Arrival order: copiers submit last, after they saw the update they copy.
        trainers.sort(key=lambda p: bool(p.attack and p.attack.copies))
        encoded: dict[str, tuple[bytes, int]] = {}
        for trainer in trainers:
            update, samples = _local_update(
                config, trainer, model, global_state, splits.num_classes, round_index, randomness_secret
            )
            if trainer.attack and trainer.attack.boosts and config.adaptive_attack and config.norm_bound:
                update = boost_to_bound(update, config.norm_bound)
            blob, _ = encode_with_policy(update, global_state, policy)  # as the node's trainer encodes
            if trainer.attack and trainer.attack.copies and encoded:
                blob = _copied_blob(encoded, by_address)
            if trainer.attack and trainer.attack.claimed_samples:
                samples = trainer.attack.claimed_samples
            encoded[trainer.address] = (blob, samples)
        hashes = {a: content_hash(blob) for a, (blob, _) in encoded.items()}
        if config.consensus:
            # The chain keeps the first update of each content hash and bounds samples by the dataset.
            kept, _ = first_by_hash((a, hashes[a]) for a in encoded)
            weights = {a: cap_samples(encoded[a][1], len(by_address[a].train)) for a in kept}
            outcome = _committee_round(
                config,
                committee,
                kept,
                encoded,
                by_address,
                scratch,
                global_state,
                spec,
                round_index,
                randomness_secret,
                _chain_seed(config, "tie", round_index) if config.chain_draws else bytes(32),
            )
        else:
            weights = {a: samples for a, (_, samples) in encoded.items()}
            outcome = RoundOutcome(
                medians=dict.fromkeys(encoded, 0),
                ranking=list(encoded),
                accepted=list(encoded),
                next_committee=list(committee),
            )
        accepted = [
            WeightedUpdate(
                decode_update(encoded[a][0], spec), weights[a], hashes[a] if config.consensus else a
            )
            for a in outcome.accepted
        ]
        if config.consensus:
            # Every honest node aggregates with the same function (backend.jobs.driver.aggregator calls
            # it too): the norm bound enforced again (colluding members can carry an update through the
            # median, not past this check), the clip to the round's median norm, the sign vote and the
            # verified step (fl_node.robust.defended_aggregate).
            defense = RoundDefense(
                top_k=config.effective_top_k,
                norm_bound=config.norm_bound,
                clip_to_median=config.clip_to_median,
                sign_vote=config.sign_vote,
                verified_step=config.verified_step,
            )
            clip_norm, votes, witness_votes = None, [], []
            if defense.needs_votes:
                # Over every submission kept on chain (not only the accepted): a committee majority of
                # attackers picks what is averaged, but not the length it may have nor which directions
                # survive (fl_node.robust.vote_roles: who votes and who only witnesses).
                submitted = {a: decode_update(encoded[a][0], spec) for a in kept}
                in_bound = [a for a in kept if within_norm_bound(submitted[a], config.norm_bound)]
                voters, witnesses = vote_roles(
                    in_bound, outcome.medians, base_median=outcome.base_median, margin=config.margin or 0
                )
                clip_norm = aggregation_clip_norm(
                    [update_norm(submitted[a]) for a in voters],
                    [update_norm(submitted[a]) for a in witnesses],
                )
                votes = [v for v in (vote_signs(submitted[a]) for a in voters) if v is not None]
                witness_votes = [v for v in (vote_signs(submitted[a]) for a in witnesses) if v is not None]
            global_state, server_state = defended_aggregate(
                strategy,
                global_state,
                accepted,
                defense=defense,
                server_state=server_state,
                clip_norm=clip_norm,
                voters=votes,
                witnesses=witness_votes,
            )
        elif accepted:
            global_state, server_state = strategy.aggregate(global_state, accepted, server_state)
        model.load_state_dict(global_state)
        metrics = evaluate(model, test_x, test_y)
        histories = [p.history for p in participants if len(p.history)]
        record = RoundRecord(
            round=round_index + 1,
            committee=[by_address[a].index for a in committee],
            updates=[
                UpdateRecord(
                    trainer=t.index,
                    attacker=t.attack is not None,
                    median=outcome.medians.get(t.address, 0),
                    accepted=t.address in outcome.accepted,
                    num_samples=weights.get(t.address, 0),
                    content_hash=hashes[t.address],
                    encoded_bytes=len(encoded[t.address][0]),
                )
                for t in trainers
            ],
            test_accuracy=metrics["accuracy"],
            test_loss=metrics["loss"],
            epsilon_rdp=_job_epsilon(histories, config, rdp_epsilon),
            epsilon_prv=_job_epsilon(histories, config, prv_epsilon),
            score_epsilon_rdp=max(
                (rdp_epsilon(p.score_history, delta=config.delta) for p in participants), default=0.0
            ),
            seconds=time.perf_counter() - started,
        )
        records.append(record)
        if on_round:
            on_round(record)
        committee = outcome.next_committee
        if config.committee_draw == "random" and config.consensus:
            # From the round's trainers (committee members do not sit twice in a row), as the rank rule.
            eligible = [t.address for t in trainers if t.address in outcome.medians]
            committee = (
                _draw(config, eligible, round_index + 1) if len(eligible) >= config.committee else committee
            )
    attackers = sorted(p.index for p in participants if p.attack)
    return SimulationResult(
        config=config,
        rounds=records,
        attackers=attackers,
        histories=[p.history for p in participants],
        final_state=global_state,
    )


def _chain_seed(config: SimulationConfig, *context: str | int) -> bytes:
    """A 32-byte stand-in for one of the contract's block-drawn seeds, fixed by the run's seed."""
    return hashlib.sha256(":".join(map(str, ("defl-sim-chain", config.seed, *context))).encode()).digest()


def _draw(config: SimulationConfig, eligible: list[str], round_index: int) -> list[str]:
    """A committee drawn uniformly from ``eligible``, seeded by the run and the round."""
    rng = np.random.default_rng([config.seed, round_index, 0xC0])
    return [eligible[i] for i in rng.choice(len(eligible), size=config.committee, replace=False)]


def _copied_blob(encoded: dict[str, tuple[bytes, int]], by_address: dict[str, Participant]) -> bytes:
    """The update a copier re-submits: the first honest one of the round (any, if none is honest)."""
    honest = [a for a in encoded if by_address[a].attack is None]
    return encoded[(honest or list(encoded))[0]][0]


def _committee_round(
    config: SimulationConfig,
    committee: list[str],
    kept: list[str],
    encoded: dict[str, tuple[bytes, int]],
    by_address: dict[str, Participant],
    scratch: torch.nn.Module,
    global_state: dict[str, torch.Tensor],
    spec,
    round_index: int,
    secret: bytes | None,
    tie_seed: bytes = bytes(32),
) -> RoundOutcome:
    """Every member scores the kept updates (and the base model when the job has a margin);
    :func:`decide_round` decides. An update over the norm bound scores 0 from honest members."""
    decoded = {a: decode_update(encoded[a][0], spec) for a in kept}
    scorable = {a for a in kept if within_norm_bound(decoded[a], config.norm_bound)}
    accomplices = {a for a in kept if by_address[a].attack is not None}
    base_update = {k: torch.zeros_like(v) for k, v in global_state.items() if v.is_floating_point()}
    scores: dict[str, dict[str, int]] = {}
    base_scores: dict[str, int] = {}
    for member_address in committee:
        member = by_address[member_address]
        if config.collude and member.attack is not None:
            scores[member_address] = colluding_scores(kept, accomplices)
            base_scores[member_address] = 0  # so that its accomplices clear any margin
            continue
        vx, vy = member.val.tensors()
        noise = member.plan.score_noise_multiplier if member.plan else None

        def evaluate_one(address: str, blob, member=member, vx=vx, vy=vy, noise=noise) -> float:
            if config.score_scale != 1.0:
                blob = scaled_update(blob, global_state, config.score_scale)
                if blob is None:  # malformed
                    return 0.0
            return score_update(
                scratch,
                global_state,
                blob,
                vx,
                vy,
                metric=config.score_metric,
                noise_multiplier=noise,
                randomness=_stream(secret, "score", round_index, member.index, address),
            )

        released = len(scorable) + (config.margin is not None)  # the base model's score is a release too
        if config.margin is not None and not config.score_relative:
            base_value = evaluate_one(BASE_KEY, base_update)
        if config.score_relative:
            # The node's scoring function, as the node's committee calls it.
            scores[member_address] = member_scores(
                scratch,
                global_state,
                {a: decoded[a] for a in kept},
                vx,
                vy,
                scale=config.score_scale,
                norm_bound=config.norm_bound,
                clip_to_median=config.score_clipped,
                metric=config.score_metric,
                noise_multiplier=noise,
                randomness=functools.partial(_stream, secret, "score", round_index, member.index),
            )
            base_scores[member_address] = BASE_SCORE
        else:
            values = {a: evaluate_one(a, encoded[a][0]) for a in kept if a in scorable}
            scores[member_address] = {a: score_to_int(values[a]) if a in values else 0 for a in kept}
            if config.margin is not None:
                base_scores[member_address] = score_to_int(base_value)
        member.charge(member.plan.score_release(released) if member.plan else None)
    return decide_round(
        kept,
        scores,
        top_k=config.effective_top_k,
        committee_size=config.committee,
        current_committee=committee,
        base_scores=base_scores if config.margin is not None else None,
        margin=config.margin or 0,
        tie_seed=tie_seed,
    )


def _job_epsilon(histories, config: SimulationConfig, accountant) -> float:
    """The largest epsilon any participant spent so far: training and scores composed."""
    if config.epsilon is None:
        return 0.0
    return max((accountant(h, delta=config.delta) for h in histories), default=0.0)


def centralized_baseline(
    dataset: str,
    *,
    model: str = "mlp",
    epsilon: float | None = None,
    epochs: int = 30,
    seed: int = 0,
    **train,
) -> float:
    """Test accuracy of training on the pooled training data (the non-federated reference)."""
    splits, net = prepared_model_and_data(dataset, model, seed=seed)
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    config = TrainConfig(epochs=epochs, target_epsilon=epsilon, rounds=1, seed=seed, **train)
    train_local(net, state, splits.train, config)
    test_x, test_y = splits.test.tensors()
    return evaluate(net, test_x, test_y)["accuracy"]
