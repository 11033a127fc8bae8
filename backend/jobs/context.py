"""Who is acting: this node's address, ledger, swarm store, peers, limits and test hooks, built
from the settings once (``current_node``).

The driver and the services take a ``NodeContext`` instead of reading settings, so the
in-process protocol tests can act as several nodes against one chain and one store. What the
node's driver remembers in this process is its ``memory`` (backend.jobs.driver.memory), never
module state: each context has its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlparse

from django.conf import settings

from backend.jobs.driver.memory import DriverMemory
from backend.peers.endpoints import EndpointGuard
from backend.peers.signing import RequestSigner

if TYPE_CHECKING:  # imported for the annotations only: all are built in current_node()
    from backend.jobs.remote_config import NodeLimits
    from backend.ledger.deployment import Ledger
    from backend.swarm.api import Swarm


class _Peer(Protocol):
    @property
    def address(self) -> str: ...

    @property
    def url(self) -> str: ...


class _Directory(Protocol):  # backend.swarm.peers.PeerDirectory, as far as a key request needs it
    def peers(self) -> Sequence[_Peer]: ...


@dataclass(frozen=True)
class PeerAccess:
    """How this node asks another node's peer API (the update-key route, jobs/sealed/key_requests.py).

    ``directory``: the peers and their endpoints, the very object the node's swarm dials
    (``swarm.factory.peer_directory``); ``signer``: the node key's request signer;
    ``allow_private``: whether loopback and private endpoints may be dialled, the swarm's own
    decision (``swarm.factory.allow_private_peers``).
    """

    directory: _Directory
    signer: RequestSigner
    allow_private: bool

    def endpoint(self, address: str) -> str:
        """``address``'s base URL (no trailing slash), checked dialable (EndpointRefused, a
        ValueError, if not); LookupError when no endpoint is known for it."""
        url = next((p.url for p in self.directory.peers() if p.address.lower() == address.lower()), "")
        if not url:
            raise LookupError(f"no endpoint known for {address}")
        base = url.rstrip("/")
        EndpointGuard(base, allow_private=self.allow_private).check()
        return base

    def signed_headers(self, base: str, path: str, body: bytes, *, receiver: str) -> dict[str, str]:
        """Headers of a node-signed POST of ``body`` to ``base + path`` for ``receiver``."""
        prefix = urlparse(base).path
        return self.signer.headers("POST", prefix + path, body, receiver=receiver)


def peer_access(private_key: bytes) -> PeerAccess:
    """The swarm's peer directory and its dialling decision, signed with ``private_key``."""
    from backend.swarm import factory

    directory = factory.peer_directory()
    return PeerAccess(directory, RequestSigner(private_key), factory.allow_private_peers(directory))


@dataclass(frozen=True)
class NodeContext:
    address: str
    ledger: Ledger
    swarm: Swarm
    # Other nodes' peer APIs, dialled as this node (the update keys of jobs/sealed).
    peers: PeerAccess
    # What a job proposed elsewhere may ask of this node (DEFL_MAX_*, jobs/remote_config.py).
    limits: NodeLimits
    # Blocks the event indexer stays behind the chain's head (DEFL_CONFIRMATIONS; 0: none).
    confirmations: int = 0
    # Test hook (DEFL_ATTACK): this node's trainer attacks, e.g. "label_flip". Never set in production.
    attack: str | None = None
    # Test hook (DEFL_HOLD_PROPOSALS_FILE): while this file exists, every member of a new committee
    # holds its vote (driver/aggregator.py), so a test can kill a member that has not voted.
    hold_proposals_file: str | None = None
    # A member of the new committee in seat s proposes once s * this many seconds passed without a
    # usable proposal (seat 0 proposes at once), so a proposer that went away does not stall the job.
    proposer_fallback_s: float = 20.0
    # A queued or running action older than this is taken to be lost (its worker died).
    action_lease_s: float = 600.0
    # A failed action is retried after this many seconds.
    retry_after_s: float = 5.0
    # Trainers start round r+1 as soon as round r is finalized, on their own aggregate of its
    # accepted updates (aggregation is deterministic), instead of waiting for the new committee
    # to fix the model on chain; the update is submitted only if the fixed model is the same.
    speculative_training: bool = True
    # How long a speculative trainer waits, inside its action, for that model to be fixed before
    # it keeps the update aside and lets the agent go on (0: never wait; the in-process tests).
    speculation_wait_s: float = 0.0
    # Niceness of the thread that trains (0: the process's own priority), see trainer.py.
    train_nice: int = 0
    # The round's actions run in this process (no broker, CELERY_TASK_ALWAYS_EAGER); False: the
    # node's Celery worker runs them, with a memory of its own, so the agent neither prefetches
    # for them nor prepares jobs itself (driver/prefetch.py, driver/warmup.py).
    actions_inline: bool = True
    # This node's driver state in this process (backend.jobs.driver.memory: the trainer's, the
    # committee's, the caches...); not part of who the node is, never compared. ``memory.clear()``
    # is what a restart does to it.
    memory: DriverMemory = field(default_factory=DriverMemory, compare=False, repr=False)


@lru_cache(maxsize=1)
def current_node() -> NodeContext:
    from backend.identity.key import node_account
    from backend.jobs.remote_config import NodeLimits
    from backend.ledger.factory import confirmations, get_ledger
    from backend.swarm.factory import node_swarm

    ledger = get_ledger()
    return NodeContext(
        address=ledger.client.address,
        ledger=ledger,
        swarm=node_swarm(),
        peers=peer_access(bytes(node_account().key)),
        limits=NodeLimits.from_settings(),
        confirmations=confirmations(ledger),
        attack=settings.DEFL_ATTACK or None,
        hold_proposals_file=settings.DEFL_HOLD_PROPOSALS_FILE or None,
        proposer_fallback_s=settings.DEFL_PROPOSER_FALLBACK_S,
        action_lease_s=settings.DEFL_ACTION_LEASE_S,
        retry_after_s=settings.DEFL_ACTION_RETRY_S,
        speculative_training=settings.DEFL_SPECULATIVE_TRAINING,
        speculation_wait_s=settings.DEFL_SPECULATION_WAIT_S,
        train_nice=settings.DEFL_TRAIN_NICE,
        actions_inline=settings.CELERY_TASK_ALWAYS_EAGER,
    )
