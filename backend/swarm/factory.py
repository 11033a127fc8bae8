"""Builds this node's swarm objects from the Django settings: the one place that reads them."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from backend.nodes.identity import node_account
from backend.swarm.api import Swarm
from backend.swarm.client import LocalTransport
from backend.swarm.network import build_network
from backend.swarm.peers import PeerDirectory, StaticPeerDirectory, parse_peers
from backend.swarm.signing import MemoryNonceCache, NonceCache
from backend.swarm.store import ChunkStore


@lru_cache(maxsize=1)
def peer_directory() -> PeerDirectory:
    # The ledger's node registry replaces this once it lands (same interface).
    return StaticPeerDirectory(parse_peers(settings.DEFL_PEERS))


@lru_cache(maxsize=1)
def local_store() -> ChunkStore:
    return ChunkStore(settings.DEFL_CHUNK_DIR, fsync=settings.DEFL_SWARM_FSYNC)


@lru_cache(maxsize=1)
def nonce_cache() -> NonceCache:
    return MemoryNonceCache()


@lru_cache(maxsize=1)
def node_swarm() -> Swarm:
    """This node's store, shared by the views, tasks and commands of one process."""
    store = local_store()
    network = build_network(
        peer_directory(),
        store,
        bytes(node_account().key),
        replication=settings.DEFL_REPLICATION,
        min_replicas=settings.DEFL_SWARM_MIN_REPLICAS,
        timeout_s=settings.DEFL_SWARM_TIMEOUT_S,
    )
    return Swarm(store, network)


@lru_cache(maxsize=1)
def local_transport() -> LocalTransport:
    return LocalTransport(local_store())
