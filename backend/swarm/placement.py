"""Where a chunk lives: the R nodes whose overlay addresses are closest to it by XOR.

A node's overlay address is keccak256 of its 20-byte chain address, so a node cannot
pick its place in the address space without picking a new key (and registering it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from eth_utils import keccak, to_bytes

T = TypeVar("T")


def overlay_address(chain_address: str) -> bytes:
    return keccak(to_bytes(hexstr=chain_address))


def xor_distance(a: bytes, b: bytes) -> int:
    return int.from_bytes(a, "big") ^ int.from_bytes(b, "big")


def rank(address: bytes, nodes: Sequence[T], overlay: Callable[[T], bytes]) -> list[T]:
    """All ``nodes``, closest to ``address`` first (ties cannot happen: overlays are hashes)."""
    return sorted(nodes, key=lambda n: xor_distance(address, overlay(n)))


def effective_replication(replication: int, node_count: int) -> int:
    """R, or every node when there are fewer than R."""
    return max(1, min(replication, node_count))


def upload_quorum(replication: int) -> int:
    """Acknowledged copies an upload needs by default: a majority of R (2 of 3).

    Requiring all R would make every upload fail while any one of R nodes is down (three nodes
    at R=3 lose all writes with one of them), and a round with them. A majority keeps a blob
    readable through one more loss; the copies still missing are added by the repair each
    holder runs on a schedule (repair_schedule.py) once their node is back or replaced.
    """
    return replication // 2 + 1
