"""An in-process federation running DeFL's round protocol, for experiments, tests and benchmarks.

Each round follows ../shared/DESIGN.md without the chain and the swarm store: the
trainers (nodes not on the committee) train locally (DP-SGD by default), encode
their updates with the codec, the committee members score every update on their
own validation data, :func:`fl_node.committee.decide_round` (the rule the contract
runs) accepts the best ``top_k`` and the next committee is drawn as the contract draws it, and the accepted
updates are aggregated deterministically into the next global model.

Every simulated node runs one job, a :class:`fl_node.job.config.JobConfig`, the node's own
definition: it derives its privacy plan, its training settings, its scoring and the aggregation
from it as a node does (fl_node.job). ``SimulationConfig`` adds only what the simulation alone
needs: the data, how many nodes and how it splits among them, which attack, and how the chain's
draws are stood in for. :func:`simulation` builds one from a dataset's name and the job's fields.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from fl_node.aggregate import WeightedUpdate
from fl_node.attacks import (
    Attack,
    TargetedAttack,
    boost_to_bound,
    choose_attackers,
    constrain_to_bound,
    draw_targeted,
    parse_attack_spec,
)
from fl_node.codec import Update, content_hash, decode_update, update_spec
from fl_node.committee import (
    RoundOutcome,
    decide_round,
    draw_committee,
    first_seed,
    round_seed,
    score_to_int,
)
from fl_node.data import ArrayDataset, DatasetSplits, load_dataset, map_features
from fl_node.dp_count import count_release, noisy_count
from fl_node.job import aggregation, training
from fl_node.job.config import DPConfig, JobConfig
from fl_node.job.plan import participant_plan as job_participant_plan
from fl_node.job.plan import scores_per_round, update_mechanism
from fl_node.job.scoring import ScoringRule, scoring
from fl_node.job.simulated import job_for
from fl_node.local_round import local_round
from fl_node.models import create_model, split_fixed_features
from fl_node.partition import partition
from fl_node.privacy import (
    ADD_REMOVE,
    PrivacyHistory,
    ReleasePlan,
    UpdateGaussianMechanism,
    prv_epsilon,
    rdp_epsilon,
)
from fl_node.privacy_plan import PrivacyPlan
from fl_node.robust import (
    RoundDefense,
    aggregation_clip_norm,
    cap_samples,
    colluding_scores,
    defended_aggregate,
    first_by_hash,
    update_norm,
    vote_roles,
    vote_signs,
    within_norm_bound,
)
from fl_node.score import BASE_KEY, BASE_SCORE, member_scores, scaled_update, score_update
from fl_node.secure_random import SecureRandom
from fl_node.sparse import encode_with_policy
from fl_node.train import TrainConfig, evaluate, train_local

COMMITTEE_DRAWS = ("chain", "random")


@dataclass(frozen=True)
class SimulationConfig:
    """One simulated federation: the ``job`` every node runs and what the simulation alone needs."""

    job: JobConfig
    dataset: str = "mnist"  # fl_node.data's registered datasets; the job's data description is its
    nodes: int = 5
    partition: str = "dirichlet:0.5"
    attack: str | None = None  # "label_flip:0.2"
    collude: bool = False  # attackers on the committee score accomplices MAX_SCORE, the others 0
    # Attackers that know the norm bound scale what they send to just under it (fl_node.attacks.boosts).
    adaptive_attack: bool = False
    # "chain": every next committee is drawn as the contract draws it (fl_node.committee.draw_committee
    # with the round's seed, from every participant); "random": drawn uniformly (seeded) from the
    # round's trainers only (so a member never sits twice in a row).
    committee_draw: str = "chain"
    # The contract's seeds (issue 32): the first committee drawn from the participants' secrets,
    # each round's seed chained from the last with the committee's salts (stand-ins fixed by the run's
    # seed here), equal medians ordered by it. False: nodes 0..committee-1 sit first and the seeds
    # start from zero (the fixed first seats the older tests are written against).
    chain_draws: bool = False
    # Every node declared its hold-out public (on chain): scores are exact and free.
    public_holdouts: bool = False
    # False: the undefended FedAvg baseline, no committee: every node trains and every update is
    # averaged as sent with the samples it claims (what a federation without DeFL's protocol does).
    consensus: bool = True
    # Experiments only: a scoring rule or aggregation defenses other than the job's (fl_node.job.scoring,
    # fl_node.job.aggregation), to measure one defense at a time. None: the job's, as a node's.
    custom_scoring: ScoringRule | None = None
    custom_defense: RoundDefense | None = None

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ValueError(f"a federation needs at least 2 nodes, got {self.nodes}")
        if not 1 <= self.job.committee_size < self.nodes:
            raise ValueError(
                f"committee must be between 1 and nodes - 1 ({self.nodes - 1}), got {self.job.committee_size}"
            )
        if self.committee_draw not in COMMITTEE_DRAWS:
            raise ValueError(f"committee_draw must be one of {COMMITTEE_DRAWS}, got {self.committee_draw!r}")
        parse_attack_spec(self.attack)  # validates early

    @property
    def trainers_per_round(self) -> int:
        return self.nodes - self.job.committee_size

    @property
    def scoring(self) -> ScoringRule:
        """How honest members score: the job's rule (fl_node.job.scoring), as a node's committee."""
        return self.custom_scoring or scoring(self.job)

    @property
    def defense(self) -> RoundDefense:
        """The aggregation's defenses: the job's (fl_node.job.aggregation), as a node's aggregator."""
        return self.custom_defense or aggregation.round_defense(self.job)


def simulation(
    dataset: str = "mnist",
    *,
    model: str = "mlp",
    nodes: int = 5,
    partition: str = "dirichlet:0.5",
    attack: str | None = None,
    collude: bool = False,
    adaptive_attack: bool = False,
    committee_draw: str = "chain",
    chain_draws: bool = False,
    public_holdouts: bool = False,
    consensus: bool = True,
    custom_scoring: ScoringRule | None = None,
    custom_defense: RoundDefense | None = None,
    **job_fields: Any,
) -> SimulationConfig:
    """A simulation of ``dataset`` whose job trains ``model`` with ``job_fields`` (JobConfig's own
    fields and defaults, the node's; ``rounds`` is required; the job trains without DP unless
    ``dp`` says otherwise)."""
    job_fields.setdefault("dp", DPConfig(mode="none"))
    splits = load_dataset(dataset, seed=job_fields.get("seed", 0))
    return SimulationConfig(
        job=job_for(splits, model, **job_fields),
        dataset=dataset,
        nodes=nodes,
        partition=partition,
        attack=attack,
        collude=collude,
        adaptive_attack=adaptive_attack,
        committee_draw=committee_draw,
        chain_draws=chain_draws,
        public_holdouts=public_holdouts,
        consensus=consensus,
        custom_scoring=custom_scoring,
        custom_defense=custom_defense,
    )


@dataclass
class Participant:
    index: int
    address: str
    train: ArrayDataset
    val: ArrayDataset
    attack: Attack | None = None
    # The size its dataset registered: a DP count under add-remove (fl_node.dp_count, charged as
    # its first release), the exact size under replace-one. Set by build_participants.
    registered: int = 0
    # Everything this participant released in the job (count, training, scores), one RDP history.
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
        return update_mechanism(self.plan) if self.plan is not None else None


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
            "config": asdict(self.config) | {"job": self.config.job.as_dict()},
            "attackers": self.attackers,
            "final_accuracy": self.final_accuracy,
            "final_epsilon_rdp": self.rounds[-1].epsilon_rdp,
            "final_epsilon_prv": self.rounds[-1].epsilon_prv,
            "attack_rejected_rounds": rejected,
            "attack_rounds": len(with_attack),
            "rounds": rounds,
        }


def prepared_model_and_data(
    dataset: str, model: str, *, seed: int, options: dict | None = None
) -> tuple[DatasetSplits, torch.nn.Module]:
    """The dataset and the trainable model (``options``: the job's model options); a fixed feature
    front-end is applied to the data once.

    See :func:`fl_node.models.split_fixed_features`: the trained mechanism and
    every prediction are the same as with the whole model, only cheaper.
    """
    splits = load_dataset(dataset, seed=seed)
    kwargs: dict[str, Any] = dict(splits.model_kwargs()) | dict(options or {})
    features, head = split_fixed_features(create_model(model, seed=seed, **kwargs))
    if features is not None:
        key = (dataset, model, seed, repr(sorted(kwargs.items())))  # what fixes the front-end
        if key not in _FEATURIZED:
            _FEATURIZED.clear()  # one dataset's features at a time
            _FEATURIZED[key] = map_features(splits, features)
        splits = _FEATURIZED[key]
    return splits, head


_FEATURIZED: dict[tuple[str, str, int, str], DatasetSplits] = {}


def node_address(seed: int, index: int) -> str:
    """A stable stand-in for a node's chain address."""
    return "0x" + hashlib.sha256(f"defl-sim:{seed}:{index}".encode()).hexdigest()[:40]


def build_participants(
    config: SimulationConfig, splits: DatasetSplits, randomness_secret: bytes | None = None
) -> list[Participant]:
    attack, fraction = parse_attack_spec(config.attack)
    seed = config.job.seed
    attackers = choose_attackers(config.nodes, fraction, seed=seed)
    train_parts = partition(splits.train.y, config.nodes, config.partition, seed=seed)
    # Every organization holds a small labelled hold-out set of its own for committee scoring.
    val_parts = partition(splits.val.y, config.nodes, "iid", seed=seed + 1)
    attacks: dict[int, Attack] = dict.fromkeys(attackers, attack) if attack is not None else {}
    if attack is not None and attack.targeted:
        # A targeted family's parameters are drawn from the run's seed; its outside pool (the
        # edge-case inputs) is the training split. Attackers are ranked by index (DBA's parts).
        drawn = targeted_attack(config, splits)
        assert drawn is not None
        attacks = {i: drawn.attacker(rank, len(attackers)) for rank, i in enumerate(sorted(attackers))}
    participants = [
        Participant(
            index=i,
            address=node_address(seed, i),
            train=splits.train.subset(train_parts[i]),
            val=splits.val.subset(val_parts[i]),
            attack=attacks.get(i),
        )
        for i in range(config.nodes)
    ]
    for participant in participants:
        records = len(participant.train) + len(participant.val)
        if config.job.dp.private and config.job.dp.adjacency == ADD_REMOVE:
            participant.registered = noisy_count(
                records, randomness=_stream(randomness_secret, "count", participant.index)
            )
            participant.charge(count_release())
        else:
            participant.registered = records
        participant.plan = participant_plan(config, participant)
    return participants


def targeted_attack(config: SimulationConfig, splits: DatasetSplits) -> TargetedAttack | None:
    """The run's targeted attack (fl_node.attacks.draw_targeted, from the run's seed), None when the
    run's attack is not a targeted family."""
    attack, _ = parse_attack_spec(config.attack)
    if attack is None or not attack.targeted:
        return None
    return draw_targeted(
        attack.name,
        seed=config.job.seed,
        input_shape=splits.input_shape,
        num_classes=splits.num_classes,
        pool=splits.train,
    )


def participant_plan(config: SimulationConfig, participant: Participant) -> PrivacyPlan:
    """The participant's privacy plan, as every node computes it (fl_node.job.plan): from the job
    and public numbers only (its registered size, its hold-out flag, the score releases of a round)."""
    return job_participant_plan(
        config.job,
        samples=participant.registered,
        public_holdout=config.public_holdouts,
        scores_per_round=scores_per_round(config.nodes, config.job.committee_size),
    )


def round_settings(job: JobConfig, round_: int, index: int, plan: PrivacyPlan) -> TrainConfig:
    """Participant ``index``'s training settings for ``round_`` (numbered from 1): the job's
    (fl_node.job.training), as a node's trainer (backend.jobs.driver.trainer.round_settings)."""
    return training.train_config(job, training.round_seed(job, round_, index), plan)


def _local_update(
    config: SimulationConfig,
    participant: Participant,
    model: torch.nn.Module,
    global_state: dict[str, torch.Tensor],
    num_classes: int,
    round_index: int,
    secret: bytes | None,
) -> tuple[dict[str, torch.Tensor], int, int]:
    """(update, samples, local steps) of one participant's round, trained as a node trains it."""
    job, plan = config.job, participant.plan
    assert plan is not None
    settings = round_settings(job, round_index + 1, participant.index, plan)
    # Adaptive work: every simulated node runs the job's nominal steps (no step times simulated).
    steps = training.nominal_steps(job)
    settings, release = training.adaptive_round(job, settings, plan, steps)
    participant.charge(release)  # charged before training, as a node does
    result = local_round(
        model,
        global_state,
        participant.train,
        settings,
        num_classes=num_classes,
        mechanism=participant.mechanism(),
        attack=participant.attack,
        attack_seed=settings.seed,
        randomness=_stream(secret, "train", round_index, participant.index),
        kept_rows=training.kept_rows(job, global_state, round_index + 1),
    )
    # A node names its planned training count (fl_node.job.plan.update_samples), which its keyed
    # split matches in expectation. A simulated participant's parts are laid out by the experiment
    # (its validation part need not be val_fraction of its records), so its own sizes stand in.
    return result.update, result.samples, steps


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

    job = config.job
    torch.manual_seed(job.seed)
    splits, model = prepared_model_and_data(
        config.dataset, job.model, seed=job.seed, options=job.model_options
    )
    _, scratch = prepared_model_and_data(config.dataset, job.model, seed=job.seed, options=job.model_options)
    # Nodes of an "absent" spec take no part (the honest-only reference); the rest keep their data.
    participants = [
        p for p in build_participants(config, splits, randomness_secret) if not (p.attack and p.attack.absent)
    ]
    if len(participants) <= job.committee_size:
        raise ValueError(
            f"{len(participants)} nodes take part: not enough for a committee of {job.committee_size}"
        )
    by_address = {p.address: p for p in participants}
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    spec = update_spec(global_state)
    rule, defense = config.scoring, config.defense  # the job's, as every node's (fl_node.job)
    server_state = None
    everyone = [p.address for p in participants]
    committee = everyone[: job.committee_size]
    seed = bytes(32)
    if config.chain_draws:
        seed = first_seed(_chain_seed(config, "start"), 0)
        committee = draw_committee(seed, everyone, job.committee_size)
    if config.committee_draw == "random":
        committee = _draw(config, [p.address for p in participants], 0)
    test_x, test_y = splits.test.tensors()
    records: list[RoundRecord] = []
    for round_index in range(job.rounds):
        started = time.perf_counter()
        if config.consensus:
            trainers = [p for p in participants if p.address not in committee]
        else:
            trainers = list(participants)
        # Arrival order: copiers submit last, after they saw the update they copy.
        trainers.sort(key=lambda p: bool(p.attack and p.attack.copies))
        encoded, steps = _train_round(
            config,
            trainers,
            by_address,
            model,
            global_state,
            splits.num_classes,
            round_index,
            randomness_secret,
        )
        hashes = {a: content_hash(blob) for a, (blob, _) in encoded.items()}
        if config.consensus:
            # The chain keeps the first update of each content hash and bounds samples by the dataset.
            kept, _ = first_by_hash((a, hashes[a]) for a in encoded)
            weights = {a: cap_samples(encoded[a][1], len(by_address[a].train)) for a in kept}
            # the round's seed, as RoundFinalized gives it: chained with the members' salts
            seed = round_seed(seed, _chain_seed(config, "mix", round_index), round_index + 1)
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
                seed,
            )
        else:
            weights = {a: samples for a, (_, samples) in encoded.items()}
            outcome = RoundOutcome(
                medians=dict.fromkeys(encoded, 0), ranking=list(encoded), accepted=list(encoded)
            )
        ids = {a: hashes[a] if config.consensus else a for a in encoded}
        accepted = [
            WeightedUpdate(decode_update(encoded[a][0], spec), weights[a], ids[a]) for a in outcome.accepted
        ]
        # The job's aggregation (fl_node.job.aggregation), as the node's aggregator's.
        strategy = aggregation.strategy(job, {ids[a]: steps[a] for a in encoded})
        if config.consensus:
            # Every honest node aggregates with the same function (backend.jobs.driver.aggregator calls
            # it too): the norm bound enforced again (colluding members can carry an update through the
            # median, not past this check), and the job's defenses (fl_node.robust.defended_aggregate).
            clip_norm: float | None = None
            votes: list[dict[str, torch.Tensor]] = []
            witness_votes: list[dict[str, torch.Tensor]] = []
            backers: list[Update] = []
            if defense.needs_votes:
                submitted = {a: decode_update(encoded[a][0], spec) for a in kept}
                clip_norm, votes, witness_votes, backers = _round_votes(
                    submitted, outcome, defense, rule.margin
                )
            global_state, server_state = defended_aggregate(
                strategy,
                global_state,
                accepted,
                defense=defense,
                server_state=server_state,
                clip_norm=clip_norm,
                voters=votes,
                witnesses=witness_votes,
                backers=backers,
            )
        elif accepted:
            global_state, server_state = strategy.aggregate(global_state, accepted, server_state)
        model.load_state_dict(global_state)
        metrics = evaluate(model, test_x, test_y)
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
            **_spent(job, participants),
            seconds=time.perf_counter() - started,
        )
        records.append(record)
        if on_round:
            on_round(record)
        if config.consensus and config.committee_draw == "chain":
            committee = draw_committee(seed, everyone, job.committee_size)  # the contract's next seats
        elif config.consensus:
            # From the round's trainers (committee members do not sit twice in a row).
            eligible = [t.address for t in trainers if t.address in outcome.medians]
            committee = (
                _draw(config, eligible, round_index + 1) if len(eligible) >= job.committee_size else committee
            )
    attackers = sorted(p.index for p in participants if p.attack)
    return SimulationResult(
        config=config,
        rounds=records,
        attackers=attackers,
        histories=[p.history for p in participants],
        final_state=global_state,
    )


def _train_round(
    config: SimulationConfig,
    trainers: list[Participant],
    by_address: dict[str, Participant],
    model: torch.nn.Module,
    global_state: dict[str, torch.Tensor],
    num_classes: int,
    round_index: int,
    secret: bytes | None,
) -> tuple[dict[str, tuple[bytes, int]], dict[str, int]]:
    """Every trainer's (encoded update, samples it claims) and local steps of the round, in arrival
    order: trained and encoded as a node's trainer does; an attacker may boost, bound, copy or lie."""
    job = config.job
    policy = job.sparse.policy()  # as the node's trainer encodes
    encoded: dict[str, tuple[bytes, int]] = {}
    steps: dict[str, int] = {}
    for trainer in trainers:
        update, samples, steps[trainer.address] = _local_update(
            config, trainer, model, global_state, num_classes, round_index, secret
        )
        if trainer.attack and trainer.attack.boosts and config.adaptive_attack and job.norm_bound:
            update = boost_to_bound(update, job.norm_bound)
        if trainer.attack and trainer.attack.bounded and job.norm_bound:
            update = constrain_to_bound(update, job.norm_bound)
        blob, _ = encode_with_policy(update, global_state, policy)
        if trainer.attack and trainer.attack.copies and encoded:
            blob = _copied_blob(encoded, by_address)
        if trainer.attack and trainer.attack.claimed_samples:
            samples = trainer.attack.claimed_samples
        encoded[trainer.address] = (blob, samples)
    return encoded, steps


def _round_votes(
    submitted: Mapping[str, Update], outcome: RoundOutcome, defense: RoundDefense, margin: int
) -> tuple[float | None, list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]], list[Update]]:
    """(clip norm, votes, witness votes, backers) of a round for fl_node.robust.defended_aggregate, as
    the node's aggregator computes them: over every submission kept on chain (not only the accepted),
    so a committee majority of attackers picks what is averaged, but not the length it may have nor
    which directions survive (fl_node.robust.vote_roles: who votes and who only witnesses)."""
    in_bound = [a for a in submitted if within_norm_bound(submitted[a], defense.norm_bound)]
    voters, witnesses = vote_roles(in_bound, outcome.medians, base_median=outcome.base_median, margin=margin)
    clip_norm = aggregation_clip_norm(
        [update_norm(submitted[a]) for a in voters], [update_norm(submitted[a]) for a in witnesses]
    )
    votes = [v for v in (vote_signs(submitted[a]) for a in voters) if v is not None]
    witness_votes = [v for v in (vote_signs(submitted[a]) for a in witnesses) if v is not None]
    # The backed magnitude's median: every submission that may vote, witnesses too (a minority of
    # them cannot move it past the honest middle, and a captured committee that scores honest updates
    # just above 0 would otherwise leave only its accomplices).
    backers = [submitted[a] for a in (*voters, *witnesses)] if defense.backed_magnitude else []
    return clip_norm, votes, witness_votes, backers


def _chain_seed(config: SimulationConfig, *context: str | int) -> bytes:
    """A 32-byte stand-in for the secrets the chain mixes into its seeds (the participants' draw
    secrets, the committee's salts), fixed by the run's seed."""
    return hashlib.sha256(":".join(map(str, ("defl-sim-chain", config.job.seed, *context))).encode()).digest()


def _draw(config: SimulationConfig, eligible: list[str], round_index: int) -> list[str]:
    """A committee drawn uniformly from ``eligible``, seeded by the run and the round."""
    rng = np.random.default_rng([config.job.seed, round_index, 0xC0])
    return [eligible[i] for i in rng.choice(len(eligible), size=config.job.committee_size, replace=False)]


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
    seed: bytes = bytes(32),
) -> RoundOutcome:
    """Every member scores the kept updates and the base model by the job's scoring rule (as a node's
    committee: fl_node.job.scoring); :func:`decide_round` decides with the job's margin. An update
    over the norm bound scores 0 from honest members."""
    rule = config.scoring
    decoded = {a: decode_update(encoded[a][0], spec) for a in kept}
    scorable = {a for a in kept if within_norm_bound(decoded[a], rule.norm_bound)}
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
        # A node divides a noisy score by its planned validation count (fl_node.job.plan), which its
        # keyed split matches in expectation; a simulated member's part is the experiment's layout.
        records = len(member.val)

        def evaluate_one(
            address: str, blob, member=member, vx=vx, vy=vy, noise=noise, records=records
        ) -> float:
            if rule.scale != 1.0:
                blob = scaled_update(blob, global_state, rule.scale)
                if blob is None:  # malformed
                    return 0.0
            return score_update(
                scratch,
                global_state,
                blob,
                vx,
                vy,
                metric=rule.metric,
                noise_multiplier=noise,
                randomness=_stream(secret, "score", round_index, member.index, address),
                records=records,
            )

        released = len(scorable) + 1  # the base model's score is a release too
        if rule.relative:
            # The node's scoring function, as the node's committee calls it.
            scores[member_address] = member_scores(
                scratch,
                global_state,
                {a: decoded[a] for a in kept},
                vx,
                vy,
                scale=rule.scale,
                norm_bound=rule.norm_bound,
                clip_to_median=rule.clip_to_median,
                metric=rule.metric,
                noise_multiplier=noise,
                randomness=functools.partial(_stream, secret, "score", round_index, member.index),
                records=records,
            )
            base_scores[member_address] = BASE_SCORE
        else:
            values = {a: evaluate_one(a, encoded[a][0]) for a in kept if a in scorable}
            scores[member_address] = {a: score_to_int(values[a]) if a in values else 0 for a in kept}
            base_scores[member_address] = score_to_int(evaluate_one(BASE_KEY, base_update))
        member.charge(member.plan.score_release(released) if member.plan else None)
    return decide_round(
        kept,
        scores,
        top_k=config.job.top_k,
        base_scores=base_scores,
        margin=rule.margin,
        seed=seed,
    )


def _spent(job: JobConfig, participants: list[Participant]) -> dict[str, float]:
    """A round record's privacy figures: the largest epsilon any participant spent so far (training
    and scores composed; RDP and PRV), and the largest on scores alone."""
    histories = [p.history for p in participants if len(p.history)]
    return {
        "epsilon_rdp": _job_epsilon(histories, job, rdp_epsilon),
        "epsilon_prv": _job_epsilon(histories, job, prv_epsilon),
        "score_epsilon_rdp": max(
            (
                rdp_epsilon(p.score_history, delta=job.dp.delta, adjacency=job.dp.adjacency)
                for p in participants
            ),
            default=0.0,
        ),
    }


def _job_epsilon(histories, job: JobConfig, accountant) -> float:
    """The largest epsilon any participant spent so far: training and scores composed."""
    if not job.dp.private:
        return 0.0
    return max(
        (accountant(h, delta=job.dp.delta, adjacency=job.dp.adjacency) for h in histories), default=0.0
    )


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
