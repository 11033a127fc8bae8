"""The nodes that form the store: a ``PeerDirectory`` interface and its configured implementation.

The chain's NodeRegistry implements the same interface (registry.py); peers can also
come from the ``DEFL_PEERS`` setting, a comma-separated list of ``<chain address>@<base URL>``
entries, e.g. ``0xAbC...@http://127.0.0.1:8101,0xDeF...@http://127.0.0.1:8102``. The
same list can be given to every node: a node recognises itself by its own address
(``factory.peer_directory`` chooses between the two).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from eth_utils import is_address, to_checksum_address

from backend.swarm.placement import overlay_address


@dataclass(frozen=True)
class Peer:
    address: str  # checksummed chain address: the key that signs this node's requests
    url: str  # base URL of the node's HTTP API, without a trailing slash; "" for no endpoint
    overlay: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", to_checksum_address(self.address))
        object.__setattr__(self, "url", self.url.rstrip("/"))
        object.__setattr__(self, "overlay", overlay_address(self.address))


class PeerDirectory(Protocol):
    def peers(self) -> list[Peer]:
        """Every registered storage node (this node included if it is registered)."""
        ...

    def is_registered(self, address: str) -> bool:
        """Whether ``address`` belongs to a registered node (whose signed requests we accept)."""
        ...


class StaticPeerDirectory:
    """A fixed list of peers: from configuration, from a test, or a snapshot of the chain.

    Its endpoints come from the operator (``DEFL_PEERS``), not from other members, so
    they are dialled as given, loopback and private addresses included (endpoints.py).
    """

    trusted_endpoints = True

    def __init__(self, peers: Iterable[Peer]) -> None:
        self._peers = {p.address: p for p in peers}

    def peers(self) -> list[Peer]:
        return list(self._peers.values())

    def is_registered(self, address: str) -> bool:
        return is_address(address) and to_checksum_address(address) in self._peers


def parse_peers(entries: Iterable[str]) -> list[Peer]:
    """Parse ``address@url`` entries (DEFL_PEERS); a bare address is a peer with no endpoint."""
    peers = []
    for entry in entries:
        address, _, url = entry.strip().partition("@")
        if not is_address(address):
            raise ValueError(f"DEFL_PEERS entry {entry!r}: expected <0x address>@<http://host:port>")
        peers.append(Peer(address, url))
    return peers
