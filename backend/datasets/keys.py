"""Wrapping a dataset's data key for a grantee node (ECIES over secp256k1).

The data key is the dataset's encrypted swarm reference (root address + decryption
key). It is wrapped with the grantee's public key as registered in the NodeRegistry
(64 bytes, uncompressed without the 0x04 prefix) and travels only inside the
grant's chain event, so only the grantee's node key can open it.
"""

from __future__ import annotations

import ecies
from coincurve import PublicKey

from backend.api.errors import InvalidInput


def wrap_key(grantee_public_key: bytes, data_key: str) -> bytes:
    if len(grantee_public_key) == 64:
        grantee_public_key = b"\x04" + grantee_public_key
    try:
        PublicKey(grantee_public_key)  # rejects points off the curve before we encrypt to them
    except ValueError as exc:
        raise InvalidInput(
            "the grantee's registered public key is not a secp256k1 point", field="node"
        ) from exc
    return ecies.encrypt(grantee_public_key, data_key.encode("ascii"))


def unwrap_key(node_private_key: bytes, wrapped_key: bytes) -> str:
    """Open a grant addressed to this node; raises ValueError when it was wrapped for another key."""
    return ecies.decrypt(node_private_key, wrapped_key).decode("ascii")
