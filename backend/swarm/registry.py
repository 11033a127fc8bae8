"""Peers from the chain: the NodeRegistry's current members and their endpoints.

``LedgerPeerDirectory`` implements ``PeerDirectory`` over a function that lists the
members; ``backend.swarm.factory`` gives it one that reads the indexer's mirror of the
Node table when that is up to date (a database query) and the registry contract
otherwise (``members()`` and one ``get_node()`` each), always through the ledger's
Python API. The list is cached for ``ttl_s``, so peer requests do not each cost chain
calls: a node that leaves (or is removed) is refused at most ``ttl_s`` plus the
indexer's lag later. A failed refresh keeps the last list (a chain RPC hiccup must not
make every peer a stranger) and is retried on the next look-up after ``retry_s``;
until a first list arrives, nobody is registered (fail closed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from eth_utils import is_address, to_checksum_address

from backend.peers.endpoints import EndpointRefused, check_url
from backend.swarm.peers import Peer

logger = logging.getLogger(__name__)

Member = tuple[str, str]
"""(chain address, endpoint URL) of one current member."""


class NodeRecord(Protocol):
    endpoint: str


class NodeRegistryReader(Protocol):
    """The read side of the ledger's NodeRegistry binding (``ledger.nodes``)."""

    def members(self) -> list[str]: ...

    def get_node(self, account: str) -> NodeRecord: ...


def chain_members(registry: NodeRegistryReader) -> list[Member]:
    """Current members and their endpoints, straight from the contract."""
    return [(address, registry.get_node(address).endpoint) for address in registry.members()]


class LedgerPeerDirectory:
    def __init__(
        self,
        read_members: Callable[[], list[Member]],
        *,
        ttl_s: float = 5.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        allow_private: bool = False,
    ) -> None:
        self._read = read_members
        self.allow_private = allow_private
        self._refused: set[tuple[str, str]] = set()  # warned about once each
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self._clock = clock
        self._peers: dict[str, Peer] = {}
        self._next_read = 0.0  # due at once
        self._lock = threading.Lock()

    def peers(self) -> list[Peer]:
        return list(self._current().values())

    def is_registered(self, address: str) -> bool:
        return is_address(address) and to_checksum_address(address) in self._current()

    def invalidate(self) -> None:
        """Read the registry again on the next look-up (after this node's own membership changed)."""
        with self._lock:
            self._next_read = 0.0

    def _current(self) -> dict[str, Peer]:
        if self._clock() < self._next_read or not self._lock.acquire(blocking=not self._peers):
            return self._peers  # fresh, or another thread is reading: use the last list meanwhile
        try:
            if self._clock() >= self._next_read:
                self._refresh()
        finally:
            self._lock.release()
        return self._peers

    def _refresh(self) -> None:
        try:
            members = self._read()
        except Exception as exc:  # the ledger's errors, a database hiccup: keep the last list
            logger.warning("node registry unavailable, keeping %d known peers: %s", len(self._peers), exc)
            self._next_read = self._clock() + self.retry_s
            return
        peers = (Peer(address, self._dialable(address, endpoint or "")) for address, endpoint in members)
        self._peers = {p.address: p for p in peers}
        self._next_read = self._clock() + self.ttl_s

    def _dialable(self, address: str, endpoint: str) -> str:
        """The endpoint, or "" for one this node will not dial (the member stays a member:
        its signed requests are accepted, it just stores nothing of ours)."""
        if not endpoint:
            return ""
        try:
            check_url(endpoint, allow_private=self.allow_private)
        except EndpointRefused as exc:
            if (address, endpoint) not in self._refused:
                self._refused.add((address, endpoint))
                logger.warning("not dialling member %s: %s", address, exc)
            return ""
        return endpoint


def mirrored_members() -> list[Member]:
    """Current members from the indexer's mirror of the chain (backend/ledger/models.py)."""
    from backend.ledger.models import Node  # late: this module is imported before apps are ready

    rows = Node.objects.filter(status=Node.Status.MEMBER).values_list("address", "endpoint")
    return [(address, endpoint) for address, endpoint in rows]
