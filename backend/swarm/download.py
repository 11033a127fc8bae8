"""The network source of the joiner: closest nodes first, every chunk verified, bounded prefetch.

Addresses are fetched in small batches, one request per node per batch, from the
closest node that is up; a chunk that is missing, corrupt, or whose node fails or times
out is asked of the next closest node (nodes marked down last, before giving up). A node that should hold a chunk (one of its R
closest) but returned nothing or garbage gets the good copy pushed back at once: reads
repair what they find. Up to ``window`` batches are in flight ahead of the reader.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from threading import Lock

from backend.swarm.errors import ChunkMissing, ChunkNotFound, PeerError
from backend.swarm.network import Network, Node
from backend.swarm.reference import is_valid_chunk


@dataclass
class FetchStats:
    corrupt: int = 0  # copies that did not hash to their address
    missing: int = 0  # copies a responsible node did not have
    failed_requests: int = 0
    repaired: int = 0  # good copies pushed back to responsible nodes
    _lock: Lock = field(default_factory=Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class NetworkSource:
    def __init__(self, network: Network, *, batch: int = 4, window: int = 6, repair: bool = True) -> None:
        self.network = network
        self.batch = batch
        self.window = window
        self.repair = repair
        self.stats = FetchStats()

    def get_many(self, addresses: Sequence[bytes]) -> Iterator[bytes]:
        ahead: deque[Future[dict[bytes, bytes]]] = deque()
        groups = [addresses[i : i + self.batch] for i in range(0, len(addresses), self.batch)]
        submitted = 0
        for group in groups:
            while submitted < len(groups) and len(ahead) < self.window:
                ahead.append(self.network.executor.submit(self.fetch_batch, groups[submitted]))
                submitted += 1
            found = ahead.popleft().result()
            for address in group:
                yield found[address]

    def fetch_batch(self, addresses: Sequence[bytes]) -> dict[bytes, bytes]:
        """Verified chunks for every address, or ``ChunkNotFound`` for the first one no node has."""
        rankings = {a: self.network.ranked(a) for a in addresses}
        asked: dict[bytes, set[str]] = {a: set() for a in addresses}
        bad: dict[bytes, list[Node]] = {a: [] for a in addresses}
        unanswered: set[bytes] = set()  # some node could not be asked about these
        corrupt: set[bytes] = set()  # some node returned a copy that does not hash to its address
        found: dict[bytes, bytes] = {}
        while len(found) < len(addresses):
            plan: dict[str, tuple[Node, list[bytes]]] = {}
            for address in addresses:
                if address in found:
                    continue
                node = self._next(rankings[address], asked[address])
                if node is None:
                    if address in unanswered or address in corrupt:
                        raise ChunkNotFound(address, "no node returned a valid copy")
                    raise ChunkMissing(address, "every node asked answered that it holds no copy")
                asked[address].add(node.peer.address)
                plan.setdefault(node.peer.address, (node, []))[1].append(address)
            for node, wanted in plan.values():
                if not self._ask(node, wanted, found, bad, corrupt):
                    unanswered.update(wanted)
        if self.repair:
            self._push_back(found, bad)
        return found

    def _next(self, ranking: list[Node], asked: set[str]) -> Node | None:
        """The closest node not asked yet that is up; as a last resort one marked down.

        A node is marked down after one failed request (it may have restarted since, or
        the failure was a timeout under load), so it is asked again before a chunk is
        given up as lost.
        """
        fallback = None
        for node in ranking:
            if node.peer.address in asked:
                continue
            if self.network.is_up(node):
                return node
            fallback = fallback or node
        return fallback

    def _ask(
        self,
        node: Node,
        wanted: list[bytes],
        found: dict[bytes, bytes],
        bad: dict[bytes, list[Node]],
        corrupt: set[bytes],
    ) -> bool:
        """Ask one node for chunks; False when it could not be asked (it is marked down)."""
        try:
            returned = node.transport.fetch(wanted)
        except PeerError:
            self.network.mark_down(node)
            self.stats.add(failed_requests=1)
            return False
        self.network.mark_up(node)
        trusted = node.transport.verified_reads
        for address in wanted:
            data = returned.get(address)
            if data is not None and (trusted or is_valid_chunk(address, data)):
                found[address] = data
                continue
            self.stats.add(corrupt=int(data is not None), missing=int(data is None))
            bad[address].append(node)
            if data is not None:
                corrupt.add(address)
        return True

    def _push_back(self, found: dict[bytes, bytes], bad: dict[bytes, list[Node]]) -> None:
        per_node: dict[str, tuple[Node, list[tuple[bytes, bytes]]]] = {}
        for address, nodes in bad.items():
            responsible = {n.peer.address for n in self.network.targets(address)}
            for node in nodes:
                if node.peer.address in responsible:
                    per_node.setdefault(node.peer.address, (node, []))[1].append((address, found[address]))
        for node, chunks in per_node.values():
            try:
                self.stats.add(repaired=len(node.transport.push(chunks)))
            except PeerError:
                self.network.mark_down(node)
