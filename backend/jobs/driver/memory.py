"""What one node's round driver remembers in this process, beside the chain and the database.

Reached as ``ctx.memory`` (``backend.jobs.context.NodeContext``): each node of the in-process
protocol tests has its own, and a restart forgets all of it, as ``DriverMemory.clear()`` does (or
a fresh ``NodeContext``). One small record per concern, holding the data only: the logic stays in
the concern's module, which reaches its record as ``ctx.memory.<concern>``. The records used from
the prefetch and key threads carry their lock. Per-round entries are keyed by (job, round) first:
the memory is one node's, so no key names the node.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from datetime import datetime

    from fl_node.local_round import LocalUpdate
    from fl_node.privacy import ReleasePlan
    from fl_node.sparse import TensorChoice
    from fl_node.train import TrainConfig

# What the sealed-update records keep (released rounds, key offers, requests in flight) is bounded
# by this many entries each (backend/jobs/sealed).
MAX_OFFERS = 4096


def _lock() -> Any:
    return field(default_factory=threading.Lock, repr=False, compare=False)


class Lru:
    """A small least-recently-used map, safe across threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key, value):
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


@dataclass
class _Record:
    """``clear()`` empties every container of the record and resets its other fields to their
    defaults, under the record's ``lock`` when it has one (the records the prefetch and key
    threads use): one rule, so a field added to a record is forgotten by a restart too."""

    def clear(self) -> None:
        lock = getattr(self, "lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            for part in fields(self):
                if part.name == "lock":
                    continue
                value = getattr(self, part.name)
                if hasattr(value, "clear"):
                    value.clear()
                elif part.default is not MISSING:
                    setattr(self, part.name, part.default)
                else:  # a field neither emptied nor reset would outlive a restart
                    raise TypeError(f"{type(self).__name__}.{part.name} has no clear() and no default")


@dataclass
class AgentMemory(_Record):
    """The agent's configuration discovery (driver/agent.py) and the jobs prepared (driver/warmup.py)."""

    discovery_attempts: dict[int, float] = field(default_factory=dict)  # job id -> monotonic time
    declined: dict[int, str] = field(default_factory=dict)  # job id -> why this node declined its config
    warmed: set[int] = field(default_factory=set)  # job ids whose first round this process prepared
    # Background actions (register, measure) handed to this process's own thread and not ended:
    # not orphans when a failed tick releases the claims left open (tasks.release_orphans).
    # Added by the agent's thread, discarded by the background one: single set operations.
    in_process: set[object] = field(default_factory=set)


@dataclass
class WorkspaceMemory(_Record):
    """driver/workspace.py: decoded global models, dataset splits, scratch modules, sightings."""

    models: Lru = field(default_factory=lambda: Lru(8))  # model hash -> (bytes, state, server_state)
    splits: Lru = field(default_factory=lambda: Lru(4))  # (dataset hash, seed, fraction) -> (train, val)
    scratch: Lru = field(default_factory=lambda: Lru(4))  # config bytes -> nn.Module
    # (job, round) -> (contract time, monotonic seconds) this node first saw the training over.
    training_seen_over: dict[tuple[int, int], tuple[int, float]] = field(default_factory=dict)


@dataclass
class BlobMemory(_Record):
    """backend/jobs/blobs.py: small blobs stored or fetched lately, by reference (bounded in bytes),
    and the reads in flight."""

    items: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    size: int = 0  # bytes held
    # reference -> set when its read in flight ends (one read per blob at a time: blobs.get)
    reading: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = _lock()


@dataclass
class SealedMemory(_Record):
    """backend/jobs/sealed: holders not answering, key requests in flight, and keys gathered but
    not read yet."""

    down: dict[str, float] = field(default_factory=dict)  # holder -> monotonic time it is asked again
    # (job, round, trainer, reference, content hash) -> a key offered, unchecked (bounded: MAX_OFFERS)
    offers: dict[tuple, bytes] = field(default_factory=dict)
    # the same keys -> the request for it in flight (gather_keys, ask_ahead), until it is answered
    asking: dict[tuple, Future] = field(default_factory=dict)
    released: set[tuple[int, int]] = field(default_factory=set)  # (job, round) whose keys may go out
    lock: threading.Lock = _lock()


@dataclass
class PrefetchMemory(_Record):
    """driver/prefetch.py: fetches in flight, key requests lately made, keys found by its threads."""

    pending: set[object] = field(default_factory=set)  # references, and ("key", job, round, trainer)
    key_tries: dict[tuple[int, int, str], float] = field(default_factory=dict)  # -> monotonic time
    found: list[tuple] = field(default_factory=list)  # (job, round, update, key), kept by the agent's thread
    lock: threading.Lock = _lock()


@dataclass(frozen=True)
class TrainedUpdate:
    """driver/trainer.py: an update trained on a model that was not fixed on chain yet, kept until it is."""

    base_hash: str
    blob: bytes  # the encoded update: held here, unpublished, until the round opens on base_hash
    content_hash: str
    samples: int
    work_seconds: float
    ahead: bool  # trained before the round opened, on this node's own aggregate
    kind: str  # the release kind it was charged as
    choices: dict[str, TensorChoice]  # each tensor's encoding (fl_node.sparse), recorded once submitted
    spend: int  # micro-epsilon the submit records on chain with the update (0: no DP)


@dataclass
class TrainingAttempt:
    """driver/trainer.py: this process's attempt at a round's training, from its reservation until its update is
    encoded: a retry after a failure in between (its database went away under the reservation,
    the task runner's bookkeeping, or the encoding) takes the reservation over, and the result
    if there is one, instead of reserving and training the round a second time."""

    since: datetime  # when its reservation was asked for
    base_hash: str
    train_config: TrainConfig
    release: ReleasePlan | None  # the ReleasePlan reserved (None: no DP)
    touched: bool = False  # the training began: without a result, its fate is unknown
    result: LocalUpdate | None = None  # the training's output (fl_node.local_round), once it returned
    work: float = 0.0


@dataclass
class TrainerMemory(_Record):
    """driver/trainer.py: updates waiting for their round to open, and attempts not encoded yet."""

    waiting: dict[tuple[int, int], TrainedUpdate] = field(default_factory=dict)
    attempts: dict[tuple[int, int], TrainingAttempt] = field(default_factory=dict)


@dataclass
class CommitteeMemory(_Record):
    """driver/committee.py: the round's updates scored as they arrived, and its score release's spend."""

    # (job, round) -> {(trainer, content hash): score (a robust job: the decoded update until scored)}
    scored: dict[tuple[int, int], dict[tuple[str, str], Any]] = field(default_factory=dict)
    # (job, round) -> the spendPrivacy of the round's score release (None: nothing owed on chain)
    score_spends: dict[tuple[int, int], Future | None] = field(default_factory=dict)


@dataclass
class AggregatorMemory(_Record):
    """driver/aggregator.py: the round's aggregate, its stored reference, updates unreadable for the vote."""

    results: dict[tuple[int, int], tuple[str, bytes]] = field(default_factory=dict)  # -> (hash, bytes)
    references: dict[tuple[int, int, str], str] = field(default_factory=dict)  # (job, round, hash) -> ref
    unreadable: dict[tuple[int, int, str], float] = field(default_factory=dict)  # (job, round, trainer)


@dataclass
class DriverMemory(_Record):
    """Everything one node's driver remembers in this process; ``clear()`` is what a restart does."""

    agent: AgentMemory = field(default_factory=AgentMemory)
    workspace: WorkspaceMemory = field(default_factory=WorkspaceMemory)
    blobs: BlobMemory = field(default_factory=BlobMemory)
    sealed: SealedMemory = field(default_factory=SealedMemory)
    prefetch: PrefetchMemory = field(default_factory=PrefetchMemory)
    trainer: TrainerMemory = field(default_factory=TrainerMemory)
    committee: CommitteeMemory = field(default_factory=CommitteeMemory)
    aggregator: AggregatorMemory = field(default_factory=AggregatorMemory)
