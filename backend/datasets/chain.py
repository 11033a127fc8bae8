"""The datasets' view of the chain: DataRegistry calls and node public keys, through the ledger.

Kept apart from services so that the flows read as steps and the ledger's API is
named in one file. Without a ledger, registration is skipped (the dataset stays
"stored", not "registered") and grants are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend import limits
from backend.api.errors import InvalidInput
from backend.ledger import access as ledger_access
from backend.ledger.access import LedgerMissing

__all__ = [
    "LedgerMissing",
    "Registration",
    "register_dataset",
    "grant",
    "revoke",
    "spend_privacy",
    "node_public_key",
]

# DataRegistry counts privacy in micro-epsilon (uint64); a cap above MAX_EPSILON_CAP is refused on chain.
MICRO_EPSILON = limits.MICRO_EPSILON
MAX_EPSILON_CAP = limits.MAX_EPSILON_CAP
_NODE_STATUS_NONE = 0


@dataclass(frozen=True)
class Registration:
    onchain_id: str
    tx_hash: str


def register_dataset(
    *,
    content_hash: str,
    swarm_root: bytes,
    schema_hash: str,
    samples: int,
    epsilon_cap: float,
    public_holdout_hash: str | None = None,
) -> Registration | None:
    """DataRegistry.registerDataset; None (skipped) without a ledger.

    ``public_holdout_hash`` (hex): the hold-out split this dataset declares public (committee
    scores on it carry no noise), recorded on chain for everyone to see; None when none. Records
    already registered (the same content hash) raise ``ledger_errors.DuplicateDataset`` with the
    existing id in ``args_["existingId"]``.
    """
    if not 0 < epsilon_cap <= MAX_EPSILON_CAP:  # NaN too: the chain would refuse it, say why first
        raise InvalidInput(
            f"epsilon_cap must be in (0, {MAX_EPSILON_CAP:g}]: the chain refuses larger privacy caps",
            field="epsilon_cap",
        )
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return None
    # Encoded and sent here rather than through DataRegistry.register_dataset, which returns
    # only the id: the API shows the transaction hash too.
    call = ledger.data.register_call(
        bytes.fromhex(content_hash.removeprefix("0x")),
        swarm_root,
        bytes.fromhex(schema_hash.removeprefix("0x")),
        samples,
        round(epsilon_cap * MICRO_EPSILON),
        bytes.fromhex(public_holdout_hash.removeprefix("0x")) if public_holdout_hash else b"\x00" * 32,
    )
    receipt = ledger.client.transact(call)
    dataset_id = receipt.event("DatasetRegistered").args["datasetId"]
    return Registration(onchain_id=str(dataset_id), tx_hash=receipt.tx_hash)


def grant(onchain_id: str, grantee: str, wrapped_key: bytes) -> str:
    return ledger_access.require_ledger().data.grant(int(onchain_id), grantee, wrapped_key).tx_hash


def revoke(onchain_id: str, grantee: str) -> str:
    return ledger_access.require_ledger().data.revoke(int(onchain_id), grantee).tx_hash


def spend_privacy(job: str | int, round_: int, micro_epsilon: int) -> str | None:
    """FederatedLearning.spendPrivacy: this node's release in ``round_`` of ``job``, counted on chain
    against the dataset it joined the job with; None (skipped) without a ledger."""
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return None
    return ledger.fl.spend_privacy(int(job), int(round_), micro_epsilon).tx_hash


def node_public_key(address: str) -> bytes | None:
    """The 64-byte public key a node registered with, or None for a node the registry does not know."""
    node = ledger_access.require_ledger().nodes.get_node(address)
    return bytes(node.pubkey) if node.status != _NODE_STATUS_NONE and node.pubkey else None
