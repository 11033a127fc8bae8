"""Registering this node on chain (NodeRegistry.registerNode), a step of ``manage.py node init``."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from backend.identity.key import public_key_bytes
from backend.ledger import access as ledger_access
from backend.ledger.access import LEDGER_MISSING
from backend.swarm.placement import overlay_address

_NODE_STATUS_NONE = 0


@dataclass(frozen=True)
class NodeRegistration:
    status: str  # "registered", "already registered", or "skipped" (no ledger)
    detail: str
    tx_hash: str = ""


def register_node_on_chain(account) -> NodeRegistration:
    """Apply to the NodeRegistry with this node's name, endpoint, public key and overlay address.

    Idempotent: a node that already applied or is a member is left as it is. The
    registry admits the deployer at once; other nodes wait for the members' votes.
    """
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return NodeRegistration("skipped", f"{LEDGER_MISSING}; run `node init` again once it is")
    existing = ledger.nodes.get_node(account.address)
    if existing.status != _NODE_STATUS_NONE:
        return NodeRegistration("already registered", f"status on chain: {existing.status.name.lower()}")
    receipt = ledger.nodes.register_node(
        settings.DEFL_NODE_NAME,
        settings.DEFL_NODE_ENDPOINT,
        public_key_bytes(account),
        overlay_address(account.address),
    )
    status = ledger.nodes.get_node(account.address).status
    return NodeRegistration("registered", f"status on chain: {status.name.lower()}", receipt.tx_hash)


def vote_admission(address: str) -> NodeRegistration:
    """This member's vote to admit ``address``; a no-op once the applicant is a member."""
    from eth_utils import is_address, to_checksum_address

    if not is_address(address):
        raise ValueError(f"{address!r} is not a chain address")
    address = to_checksum_address(address)
    ledger = ledger_access.require_ledger()
    if ledger.nodes.is_member(address):
        return NodeRegistration("already registered", f"{address} is a member already")
    receipt = ledger.nodes.vote_admission(address)
    status = "admitted" if ledger.nodes.is_member(address) else "vote recorded, more votes needed"
    return NodeRegistration("voted", f"{address}: {status}", receipt.tx_hash)
