"""The datasets' view of the chain: DataRegistry calls and node public keys, through the ledger.

Kept apart from services so that the flows read as steps and the ledger's API is
named in one file. Without a ledger, registration is skipped (the dataset stays
"stored", not "registered") and grants are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.api.errors import InvalidInput
from backend.ledger import access as ledger_access
from backend.ledger.access import LedgerMissing
from backend.ledger.resources import SpendKind
from fl_node.job import limits

__all__ = [
    "LedgerMissing",
    "Registration",
    "register_dataset",
    "grant",
    "revoke",
    "rotate_key",
    "grant_cap",
    "is_granted",
    "carried_over",
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
    source_id: str = ""  # the budget source the chain put the dataset in ("" before contracts v2)


def register_dataset(
    *,
    commitment: str,
    swarm_root: bytes,
    schema_hash: str,
    samples: int,
    epsilon_cap: float,
    public_holdout_hash: str | None = None,
    disjoint: bool = False,
    initial_spend: int = 0,
) -> Registration | None:
    """DataRegistry.registerDataset; None (skipped) without a ledger.

    ``commitment`` (hex): the dataset's commitment keyed with its secret (the chain does not
    interpret it; it refuses one registered twice with ``DuplicateDataset`` naming the existing
    id in ``args_["existingId"]``). ``public_holdout_hash`` (hex): the commitment to the hold-out
    split this dataset declares public (committee scores on it carry no noise), recorded on chain
    for everyone to see; None when none. ``disjoint``: the provider declares that the dataset
    shares no record with its others, so the chain gives it a budget source of its own.
    ``initial_spend``: micro-epsilon of the release the registration makes (``samples`` a DP count
    of the records), counted into the dataset's budget source on chain; 0 for none.
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
        bytes.fromhex(commitment.removeprefix("0x")),
        swarm_root,
        bytes.fromhex(schema_hash.removeprefix("0x")),
        samples,
        round(epsilon_cap * MICRO_EPSILON),
        bytes.fromhex(public_holdout_hash.removeprefix("0x")) if public_holdout_hash else b"\x00" * 32,
        disjoint,
        initial_spend=initial_spend,
    )
    receipt = ledger.client.transact(call)
    event = receipt.event("DatasetRegistered").args
    return Registration(
        onchain_id=str(event["datasetId"]), tx_hash=receipt.tx_hash, source_id=str(event["sourceId"])
    )


def grant(onchain_id: str, grantee: str, wrapped_key: bytes, epsilon_cap: float) -> str:
    """DataRegistry.grant: the wrapped data key, and the cap on what the grantee's jobs may spend."""
    if not 0 < epsilon_cap <= MAX_EPSILON_CAP:
        raise InvalidInput(f"a grant's epsilon cap must be in (0, {MAX_EPSILON_CAP:g}]", field="epsilon_cap")
    micro = round(epsilon_cap * MICRO_EPSILON)
    return ledger_access.require_ledger().data.grant(int(onchain_id), grantee, wrapped_key, micro).tx_hash


def grant_cap(onchain_id: str, grantee: str) -> float:
    """The epsilon cap the chain holds for ``grantee``'s grant (what re-granting must keep)."""
    cap = ledger_access.require_ledger().data.get_grant(int(onchain_id), grantee).cap
    return cap / MICRO_EPSILON


def rotate_key(onchain_id: str, swarm_root: bytes) -> str:
    """DataRegistry.rotateKey: the root of the dataset re-encrypted under a fresh key."""
    return ledger_access.require_ledger().data.rotate_key(int(onchain_id), swarm_root).tx_hash


def is_granted(onchain_id: str, grantee: str) -> bool:
    return ledger_access.require_ledger().data.is_granted(int(onchain_id), grantee)


def carried_over() -> bool:
    """This node runs on contracts that carried a previous deployment's consortium over, and their
    import is closed (docs/OPERATIONS.md, Upgrades); False without a ledger."""
    ledger = ledger_access.node_ledger()
    return ledger is not None and ledger.deployment.previous is not None and not ledger.nodes.import_open()


def revoke(onchain_id: str, grantee: str) -> str:
    return ledger_access.require_ledger().data.revoke(int(onchain_id), grantee).tx_hash


def spend_privacy(
    job: str | int, round_: int, micro_epsilon: int, kind: SpendKind, steps: int = 0
) -> str | None:
    """FederatedLearning.spendPrivacy: this node's release in ``round_`` of ``job`` (``kind``: an
    update, scores or a withheld update; ``steps``: a training release's local steps), counted on
    chain against the budget source of the dataset it joined the job with; None (skipped) without
    a ledger."""
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return None
    return ledger.fl.spend_privacy(int(job), int(round_), micro_epsilon, kind, steps).tx_hash


def node_public_key(address: str) -> bytes | None:
    """The 64-byte public key a node registered with, or None for a node the registry does not know."""
    node = ledger_access.require_ledger().nodes.get_node(address)
    return bytes(node.pubkey) if node.status != _NODE_STATUS_NONE and node.pubkey else None
