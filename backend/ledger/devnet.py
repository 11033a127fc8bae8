"""Helpers for development chains (tests, the local demo): dev keys and a bootstrapped consortium."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_keys import keys
from eth_utils import keccak, to_canonical_address

from .deployment import Ledger


def dev_account(index: int, seed: str = "defl-dev") -> LocalAccount:
    """A deterministic throwaway key for development chains only."""
    return Account.from_key(hashlib.sha256(f"{seed}:{index}".encode()).digest())


def public_key(account: LocalAccount) -> bytes:
    """The 64-byte uncompressed secp256k1 public key (no 0x04 prefix), as NodeRegistry takes it."""
    return keys.PrivateKey(account.key).public_key.to_bytes()


def overlay_of(address: str) -> bytes:
    """A swarm overlay address derived from the chain address (keccak256 of its 20 bytes)."""
    return keccak(to_canonical_address(address))


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
