"""Typed results of ledger calls: dataclasses and NamedTuples, never raw dicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from .abi import DecodedEvent


@dataclass(frozen=True)
class TxReceipt:
    tx_hash: str
    block_number: int
    gas_used: int
    status: int
    contract_address: str | None = None
    events: tuple[DecodedEvent, ...] = ()

    def event(self, name: str) -> DecodedEvent:
        """The first event of that name in this transaction (KeyError if none)."""
        for item in self.events:
            if item.name == name:
                return item
        raise KeyError(f"no {name} event in transaction {self.tx_hash}")


class NodeStatus(IntEnum):
    NONE = 0
    APPLIED = 1
    MEMBER = 2


@dataclass(frozen=True)
class NodeInfo:
    address: str
    name: str
    endpoint: str
    pubkey: bytes
    overlay: bytes
    status: NodeStatus


class JobStatus(IntEnum):
    NONE = 0
    OPEN = 1
    RUNNING = 2
    FINISHED = 3
    CANCELLED = 4
    FAILED = 5
    DRAWING = 6  # started: the participants reveal their draw secrets, then the first committee is drawn


class RoundPhase(IntEnum):
    TRAINING = 0
    AGGREGATING = 1


@dataclass(frozen=True)
class JobSpec:
    """What proposeJob takes. Deadlines are unix seconds (or block numbers with use_blocks).

    ``max_spend_per_round``: the most micro-epsilon (1_000_000 = epsilon 1.0) one participant may
    record for one release with spendPrivacy; 0 for a job without DP (no spend is then accepted
    and submitUpdate needs none).
    """

    config_hash: bytes
    initial_model_ref: bytes
    initial_model_hash: bytes
    rounds: int
    committee_size: int
    top_k: int
    min_trainers: int
    join_deadline: int
    train_period: int
    score_period: int
    use_blocks: bool = False
    max_spend_per_round: int = 0
    # basis points an update's median score must beat the base (current global) model's median by
    margin: int = 0

    def as_abi(self) -> tuple[Any, ...]:
        return (
            self.config_hash,
            self.initial_model_ref,
            self.initial_model_hash,
            self.rounds,
            self.committee_size,
            self.top_k,
            self.min_trainers,
            self.use_blocks,
            self.join_deadline,
            self.train_period,
            self.score_period,
            self.max_spend_per_round,
            self.margin,
        )


@dataclass(frozen=True)
class JobState:
    job_id: int
    proposer: str
    rounds: int
    round: int
    committee_size: int
    top_k: int
    min_trainers: int
    status: JobStatus
    phase: RoundPhase
    use_blocks: bool
    join_deadline: int
    train_period: int
    score_period: int
    update_deadline: int
    score_deadline: int
    participant_count: int
    update_count: int
    score_count: int  # members that revealed their scores this round
    commit_count: int  # members that committed to scores this round
    max_spend_per_round: int
    margin: int
    reveal_count: int  # participants that revealed their draw secret
    early_count: int  # updates of the next round sent while this one aggregates (submitUpdate, early)
    config_hash: bytes
    model_hash: bytes
    model_ref_digest: bytes
    seed: bytes  # the job's random state: every draw derives from it
    mix: bytes  # XOR of the secrets and salts revealed since the last draw


@dataclass(frozen=True)
class ParticipantInfo:
    joined: bool
    index: int
    dataset_id: int
    update_round: int
    update_index: int
    score_round: int
    vote_round: int
    committee_round: int
    seat: int
    spend_round: int = 0  # the last round this node recorded a privacy spend for
    spends: int = 0  # how many it recorded for spend_round (at most MAX_SPENDS_PER_ROUND)
    samples: int = 0  # its dataset's registered size: the most samples an update may name
    commit_round: int = 0  # the last round this node committed to scores for
    score_spend_round: int = 0  # the last round it recorded a score release for
    flags: int = 0  # DRAWN (1: revealed its draw secret) | PUBLIC_HOLDOUT (2)

    @property
    def drawn(self) -> bool:
        """It revealed its draw secret in time: it may train and sit on committees."""
        return bool(self.flags & 1)


@dataclass(frozen=True)
class UpdateInfo:
    trainer: str
    packed_scores: int

    def scores_by_seat(self) -> dict[int, int]:
        """Seat -> score for the members who scored this update."""
        out = {}
        for seat in range(16):
            value = (self.packed_scores >> (16 * seat)) & 0xFFFF
            if value:
                out[seat] = value - 1
        return out


@dataclass(frozen=True)
class VoteInfo:
    """The votes for one (model hash, reference) pair of a round; ``proposer``: its first voter."""

    proposer: str
    votes: int
    ref_digest: bytes


class SpendKind(IntEnum):
    """What a recorded privacy spend released (DataRegistry.PrivacySpent.kind)."""

    UPDATE = 0  # a published training update
    SCORES = 1  # a committee member's noisy scores
    WITHHELD = 2  # a training release computed and never published (a discarded speculation)


@dataclass(frozen=True)
class DatasetInfo:
    dataset_id: int
    owner: str
    samples: int
    source_id: int  # the privacy budget it shares (SourceInfo)
    privacy_cap: int
    commitment: bytes  # keyed by the owner's node: says nothing about the records
    schema_hash: bytes
    swarm_ref: bytes
    public_holdout_hash: bytes = b"\x00" * 32  # the hold-out split declared public; zero when none

    @property
    def has_public_holdout(self) -> bool:
        return any(self.public_holdout_hash)


@dataclass(frozen=True)
class SourceInfo:
    """A privacy budget shared by datasets that may hold the same records (micro-epsilon)."""

    source_id: int
    owner: str
    cap: int
    spent: int


@dataclass(frozen=True)
class GrantInfo:
    active: bool
    cap: int  # micro-epsilon the grantee's jobs may spend on the dataset
    spent: int


@dataclass(frozen=True)
class RuleOutcome:
    """CommitteeRule's answer: each update's median (in the order given), the accepted (best
    first) and the base median (fl_node.committee.decide_round's)."""

    medians: list[int]
    accepted: list[str]
    base_median: int = 0


@dataclass(frozen=True)
class Deployment:
    chain_id: int
    block: int
    addresses: dict[str, str] = field(default_factory=dict)
    evm_version: str = "cancun"  # the hardfork the contracts were compiled for (artifacts.EVM_VERSIONS)
    # The deployment this one carried the consortium over from (docs/OPERATIONS.md, Upgrades):
    # read-only, its jobs finish there and stay readable. None for a first deployment.
    previous: Deployment | None = None

    def address(self, name: str) -> str:
        return self.addresses[name]
