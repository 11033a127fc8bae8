"""The nodes of the store as one address space: placement, liveness and the thread pool.

A ``Network`` ranks nodes by XOR distance for an address and remembers, for a short
while, which ones failed, so an upload or download stops asking a node that is down.
Built from a peer directory, it re-reads the directory (at most every ``refresh_s``, at
the start of an operation) so nodes that join or leave the registry join or leave the
placement without a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from backend.peers.endpoints import EndpointRefused
from backend.peers.signing import RequestSigner
from backend.swarm.client import ChunkTransport, LocalTransport, PeerClient
from backend.swarm.errors import PeerError
from backend.swarm.peers import Peer, PeerDirectory
from backend.swarm.placement import effective_replication, rank, upload_quorum
from backend.swarm.store import ChunkStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Node:
    peer: Peer
    transport: ChunkTransport
    local: bool = False


class Network:
    def __init__(
        self,
        nodes: list[Node],
        *,
        replication: int,
        min_replicas: int = 0,
        threads: int = 8,
        down_for_s: float = 15.0,
        membership: Callable[[], list[Node]] | None = None,
        refresh_s: float = 10.0,
    ) -> None:
        if not nodes:
            raise ValueError("a network needs at least one node")
        self.nodes = nodes
        self._membership = membership
        self.refresh_s = refresh_s
        self._next_refresh = time.monotonic() + refresh_s
        self.replication = replication
        self._min_replicas = min_replicas
        self.down_for_s = down_for_s
        self._down: dict[str, float] = {}
        self._lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="swarm")

    def refresh(self, *, force: bool = False) -> None:
        """Re-read the membership when due; an operation in progress keeps the list it started with."""
        if self._membership is None or (not force and time.monotonic() < self._next_refresh):
            return
        self._next_refresh = time.monotonic() + self.refresh_s
        self.nodes = self._membership()

    @property
    def r(self) -> int:
        return effective_replication(self.replication, len(self.nodes))

    @property
    def min_replicas(self) -> int:
        """Acknowledged copies an upload needs per chunk: the setting, or a majority of R when unset (0)."""
        return min(self._min_replicas or upload_quorum(self.r), self.r)

    def ranked(self, address: bytes, *, live_only: bool = False) -> list[Node]:
        nodes = [n for n in self.nodes if self.is_up(n)] if live_only else self.nodes
        return rank(address, nodes, lambda n: n.peer.overlay)

    def targets(self, address: bytes) -> list[Node]:
        """Where a chunk should live now: the R closest nodes among those that are up."""
        return self.ranked(address, live_only=True)[: self.r]

    def is_up(self, node: Node) -> bool:
        with self._lock:
            until = self._down.get(node.peer.address)
        return until is None or until < time.monotonic()

    def mark_down(self, node: Node) -> None:
        with self._lock:
            self._down[node.peer.address] = time.monotonic() + self.down_for_s

    def mark_up(self, node: Node) -> None:
        if node.peer.address in self._down:  # unlocked peek: the common case takes no lock
            with self._lock:
                self._down.pop(node.peer.address, None)

    def probe(self) -> list[Node]:
        """Ask every node whether it answers; mark the silent ones down; return those up."""
        up = []
        for node in self.nodes:
            try:
                node.transport.has([])
            except PeerError:
                self.mark_down(node)
                continue
            with self._lock:
                self._down.pop(node.peer.address, None)
            up.append(node)
        return up

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        for node in self.nodes:
            close = getattr(node.transport, "close", None)
            if close:
                close()


def build_network(
    directory: PeerDirectory,
    store: ChunkStore,
    private_key: bytes,
    *,
    replication: int,
    min_replicas: int = 0,
    timeout_s: float = 30.0,
    allow_private: bool = False,
    on_transfer: Callable[[str, int], None] | None = None,
) -> Network:
    """This node (its own store) plus a signed HTTP client for every other registered node.

    ``on_transfer(direction, size)`` is told of the chunk bytes each client sends and receives.

    Endpoints from a directory that does not vouch for them (the chain's registry) are
    dialled only where endpoints.py allows: public addresses, unless ``allow_private``.
    """
    signer = RequestSigner(private_key)
    private_ok = allow_private or getattr(directory, "trusted_endpoints", False)
    local = LocalTransport(store)
    known: dict[Peer, Node] = {}  # kept across refreshes: a peer keeps its pooled connections

    def membership() -> list[Node]:
        nodes: list[Node] = []
        me: Node | None = None
        current: dict[Peer, Node] = {}
        for peer in directory.peers():
            if peer.address == signer.address:
                me = Node(peer, local, local=True)
            elif peer.url:
                node = known.get(peer) or _peer_node(peer, signer, private_ok, timeout_s, on_transfer)
                if node is None:
                    continue
                current[peer] = node
                nodes.append(node)
        known.clear()
        known.update(current)
        # A node always stores into its own store, listed or not (a single node needs no peers).
        nodes.insert(0, me or Node(Peer(signer.address, ""), local, local=True))
        return nodes

    return Network(membership(), replication=replication, min_replicas=min_replicas, membership=membership)


def _peer_node(
    peer: Peer,
    signer: RequestSigner,
    allow_private: bool,
    timeout_s: float,
    on_transfer: Callable[[str, int], None] | None = None,
) -> Node | None:
    try:
        client = PeerClient(
            peer.url,
            signer,
            receiver=peer.address,
            allow_private=allow_private,
            timeout_s=timeout_s,
            on_transfer=on_transfer,
        )
    except EndpointRefused as exc:
        logger.warning("not dialling %s: %s", peer.address, exc)
        return None
    return Node(peer, client)
