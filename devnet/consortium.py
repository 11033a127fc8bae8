"""Helpers for development chains (tests, the local demo): dev keys and a bootstrapped consortium."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from eth_account import Account
from eth_account.signers.local import LocalAccount

from backend.identity.key import public_key_bytes as public_key  # the node's rule, as overlay_of
from backend.ledger.deployment import Ledger
from backend.swarm.placement import overlay_address as overlay_of  # a node's rule, not a copy of it


def dev_account(index: int, seed: str = "defl-dev") -> LocalAccount:
    """A deterministic throwaway key for development chains only."""
    return Account.from_key(hashlib.sha256(f"{seed}:{index}".encode()).digest())


def bootstrap_consortium(ledgers: Sequence[Ledger], endpoints: Sequence[str]) -> None:
    """Admit every account: the first must be the deployer; later ones get a majority of votes."""
    for i, (ledger, endpoint) in enumerate(zip(ledgers, endpoints, strict=True)):
        account = ledger.client.account
        ledger.nodes.register_node(f"node-{i}", endpoint, public_key(account), overlay_of(account.address))
        if i == 0:
            continue
        for voter in ledgers[:i]:
            if ledger.nodes.is_member(account.address):
                break
            voter.nodes.vote_admission(account.address)
