"""The datasets' view of the chain: DataRegistry calls and node public keys, through the ledger.

Kept apart from services so that the flows read as steps and the ledger's API is
named in one file. Until the ledger's client exists, ``ledger_client()`` returns
None and registration is skipped (the dataset stays "stored", not "registered").
"""

from __future__ import annotations

from dataclasses import dataclass

MICRO_EPSILON = 1_000_000  # DataRegistry counts privacy in micro-epsilon (uint64)


@dataclass(frozen=True)
class Registration:
    onchain_id: str
    tx_hash: str


class LedgerMissing(RuntimeError):
    """This build has no ledger client; chain steps are skipped where that is allowed."""


def ledger_client():
    """The ledger's client for this node, or None when the ledger is not available."""
    try:
        from backend.ledger.factory import get_client
    except ImportError:
        return None
    return get_client()


def _require_client():
    client = ledger_client()
    if client is None:
        raise LedgerMissing("the ledger is not available on this node")
    return client


def register_dataset(
    *, content_hash: str, swarm_root: bytes, schema_hash: str, samples: int, epsilon_cap: float
) -> Registration | None:
    client = ledger_client()
    if client is None:
        return None
    receipt = client.data_registry.register_dataset(
        content_hash=bytes.fromhex(content_hash),
        swarm_ref=swarm_root,
        schema_hash=bytes.fromhex(schema_hash),
        samples=samples,
        privacy_cap=round(epsilon_cap * MICRO_EPSILON),
    )
    return Registration(onchain_id=str(receipt.dataset_id), tx_hash=receipt.tx_hash)


def grant(onchain_id: str, grantee: str, wrapped_key: bytes) -> str:
    return _require_client().data_registry.grant(int(onchain_id), grantee, wrapped_key).tx_hash


def revoke(onchain_id: str, grantee: str) -> str:
    return _require_client().data_registry.revoke(int(onchain_id), grantee).tx_hash


def node_public_key(address: str) -> bytes | None:
    """The 64-byte public key a node registered with, or None for an unknown node."""
    node = _require_client().node_registry.get_node(address)
    return node.pubkey if node else None
