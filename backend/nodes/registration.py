"""Registering this node on chain (NodeRegistry.registerNode), a step of ``manage.py node init``."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from eth_keys import keys

from backend.nodes.overview import _overlay


@dataclass(frozen=True)
class NodeRegistration:
    status: str  # "registered", "already registered", or "skipped"
    detail: str
    tx_hash: str = ""


def public_key_bytes(account) -> bytes:
    """The 64-byte uncompressed public key (no 0x04 prefix), as NodeRegistry stores it."""
    return keys.PrivateKey(account.key).public_key.to_bytes()


def register_node_on_chain(account) -> NodeRegistration:
    try:
        from backend.ledger.factory import get_client
    except ImportError:
        return NodeRegistration(
            "skipped", "the ledger is not available in this build; run `node init` again later"
        )
    client = get_client()
    existing = client.node_registry.get_node(account.address)
    if existing is not None:
        return NodeRegistration("already registered", f"{account.address} is {existing.status} on chain")
    overlay = _overlay(account.address)
    receipt = client.node_registry.register_node(
        name=settings.DEFL_NODE_NAME,
        endpoint=settings.DEFL_NODE_ENDPOINT,
        pubkey=public_key_bytes(account),
        overlay=bytes.fromhex(overlay[2:]) if overlay else bytes(32),
    )
    return NodeRegistration("registered", f"applied as {settings.DEFL_NODE_NAME!r}", receipt.tx_hash)
