"""Who is acting: this node's address, ledger, swarm store and test hooks, built from the settings once.

The driver and the services take a ``NodeContext`` instead of reading settings, so the
in-process protocol tests can act as several nodes against one chain and one store.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings


@dataclass(frozen=True)
class NodeContext:
    address: str
    ledger: object  # backend.ledger.deployment.Ledger
    swarm: object  # backend.swarm.api.Swarm
    # Test hook (DEFL_ATTACK): this node's trainer attacks, e.g. "label_flip". Never set in production.
    attack: str | None = None
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


@lru_cache(maxsize=1)
def current_node() -> NodeContext:
    from backend.ledger.factory import get_ledger
    from backend.swarm.factory import node_swarm

    ledger = get_ledger()
    return NodeContext(
        address=ledger.client.address,
        ledger=ledger,
        swarm=node_swarm(),
        attack=settings.DEFL_ATTACK or None,
        proposer_fallback_s=settings.DEFL_PROPOSER_FALLBACK_S,
        action_lease_s=settings.DEFL_ACTION_LEASE_S,
        retry_after_s=settings.DEFL_ACTION_RETRY_S,
        speculative_training=settings.DEFL_SPECULATIVE_TRAINING,
        speculation_wait_s=settings.DEFL_SPECULATION_WAIT_S,
        train_nice=settings.DEFL_TRAIN_NICE,
    )
