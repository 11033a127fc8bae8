"""Builds this node's swarm objects from the Django settings: the one place that reads them.

Peers: the ``DEFL_PEERS`` list when it is set; otherwise the members of the chain's
NodeRegistry when a shared chain is configured (``DEFL_CHAIN_URL``). The embedded
in-process EVM is private to one process, so it can list no other node: without either,
the store is this node alone.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from backend.identity.key import node_account
from backend.peers.guard import PeerAuth
from backend.peers.signing import NonceCache
from backend.swarm.api import Swarm
from backend.swarm.client import LocalTransport
from backend.swarm.network import build_network
from backend.swarm.peers import PeerDirectory, StaticPeerDirectory, parse_peers
from backend.swarm.registry import LedgerPeerDirectory, Member, chain_members, mirrored_members
from backend.swarm.replay import RATE_WINDOW_S, DatabaseNonceCache
from backend.swarm.store import ChunkStore, StoreUsage
from backend.telemetry.counters import swarm_transfer

# The indexer's mirror stands in for the chain while it is at most this many blocks behind.
MIRROR_MAX_LAG_BLOCKS = 5
REGISTRY_TTL_S = 5.0


@lru_cache(maxsize=1)
def peer_directory() -> PeerDirectory:
    if settings.DEFL_PEERS or not settings.DEFL_CHAIN_URL:
        return StaticPeerDirectory(parse_peers(settings.DEFL_PEERS))
    return LedgerPeerDirectory(
        registry_members, ttl_s=REGISTRY_TTL_S, allow_private=settings.DEFL_ALLOW_PRIVATE_PEERS
    )


def allow_private_peers(directory: PeerDirectory) -> bool:
    """Whether this node dials peers' loopback and private endpoints (backend.peers.endpoints):
    ``DEFL_ALLOW_PRIVATE_PEERS``, or a directory that vouches for its endpoints (the operator's
    ``DEFL_PEERS`` list). One decision for the store's network and the jobs' key requests."""
    return bool(settings.DEFL_ALLOW_PRIVATE_PEERS or getattr(directory, "trusted_endpoints", False))


def registry_members() -> list[Member]:
    """The NodeRegistry's members: from the indexer's mirror when it is current, else the chain."""
    from backend.ledger import access as ledger_access  # late: the ledger is built on first use
    from backend.ledger import factory as ledger_factory

    ledger = ledger_access.require_ledger()
    indexed = ledger_access.indexed_block(ledger)
    lag = ledger_factory.confirmations(ledger) + MIRROR_MAX_LAG_BLOCKS
    if indexed is not None and indexed >= ledger.deployment.block:
        if ledger.client.block_number() - indexed <= lag:
            return mirrored_members()
    return chain_members(ledger.nodes)


@lru_cache(maxsize=1)
def local_store() -> ChunkStore:
    return ChunkStore(settings.DEFL_CHUNK_DIR, fsync=settings.DEFL_SWARM_FSYNC)


def storage_usage() -> StoreUsage:
    """This node's chunk store in numbers (chunks, bytes, pinned): read without building the
    network, so a node without its key yet still reports it (the node overview)."""
    return local_store().usage()


@lru_cache(maxsize=1)
def nonce_cache() -> NonceCache:
    """In the node's database: shared by its web workers, agent and celery (replay.py)."""
    return DatabaseNonceCache()


@lru_cache(maxsize=1)
def own_address() -> str:
    """This node's chain address: the receiver every peer request to it must be signed for."""
    return node_account().address


def peer_auth() -> PeerAuth:
    """What the peer routes' guard checks a request against (``backend.peers.guard``), now."""
    nonces = nonce_cache()
    return PeerAuth(
        receiver=own_address(),
        is_registered=peer_directory().is_registered,
        nonces=nonces,
        max_skew_s=settings.DEFL_SWARM_CLOCK_SKEW_S,
        body_timeout_s=settings.DEFL_SWARM_BODY_TIMEOUT_S,
        max_body=settings.DEFL_SWARM_MAX_BATCH_BYTES,
        requests_per_min=settings.DEFL_SWARM_PEER_REQUESTS_PER_MIN,
        bytes_per_min=settings.DEFL_SWARM_PEER_BYTES_PER_MIN,
        usage=getattr(nonces, "usage", None),
        rate_window_s=RATE_WINDOW_S,
    )


@lru_cache(maxsize=1)
def node_swarm() -> Swarm:
    """This node's store, shared by the views, tasks and commands of one process."""
    store = local_store()
    directory = peer_directory()
    network = build_network(
        directory,
        store,
        bytes(node_account().key),
        replication=settings.DEFL_REPLICATION,
        min_replicas=settings.DEFL_SWARM_MIN_REPLICAS,
        timeout_s=settings.DEFL_SWARM_TIMEOUT_S,
        allow_private=allow_private_peers(directory),
        on_transfer=swarm_transfer,
    )
    return Swarm(store, network)


@lru_cache(maxsize=1)
def local_transport() -> LocalTransport:
    return LocalTransport(local_store())
