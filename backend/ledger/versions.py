"""Which protocol version the deployed contracts speak, and whether this node speaks it.

Each of NodeRegistry, DataRegistry and FederatedLearning states its version in a public
constant ``PROTOCOL_VERSION`` (uint16). The contracts of the first releases had none: a contract
without it is version 1. A node refuses contracts of a version it does not speak (its agent and
its `node` command stop with the reason; its readiness check fails with it), since a node that
misread a contract's rules would send transactions the others reject, or worse, accept.

How a consortium moves to a new contract version: docs/OPERATIONS.md, "Upgrades".
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_utils import keccak

from .errors import ContractRevert

# The protocol versions this node's code speaks. A release that speaks a new one adds it here;
# a release that drops an old one removes it (its nodes then refuse a consortium still on it).
# 1: the contracts without the constant; 2: the first with it (the contracts set PROTOCOL_VERSION
# = 2). tests/ledger/test_versions.py deploys this release's own artifacts: they must be spoken.
SPOKEN_VERSIONS = frozenset({1, 2})
VERSIONED_CONTRACTS = ("NodeRegistry", "DataRegistry", "FederatedLearning")
_SELECTOR = keccak(text="PROTOCOL_VERSION()")[:4]
MAX_VERSION = 2**16 - 1


@dataclass(frozen=True)
class ContractVersion:
    contract: str
    address: str
    version: int | None  # None: no code at the address


def read_version(client, address: str) -> int | None:
    """The contract's PROTOCOL_VERSION; 1 for a contract without one; None when no code is there."""
    if not client.has_code(address):
        return None
    from .abi import ContractCall

    call = ContractCall(to=address, function="PROTOCOL_VERSION", data=_SELECTOR, output_types=("uint16",))
    try:
        (version,) = client.call(call)
    except ContractRevert:  # no such function (and no fallback): a contract of the first version
        return 1
    return int(version)


def deployed_versions(ledger) -> list[ContractVersion]:
    addresses = ledger.deployment.addresses
    return [
        ContractVersion(name, addresses[name], read_version(ledger.client, addresses[name]))
        for name in VERSIONED_CONTRACTS
        if name in addresses
    ]


def check_deployment(ledger) -> str | None:
    """None when every contract is there and speaks a version this node speaks; else why not."""
    found = deployed_versions(ledger)
    missing = [v for v in found if v.version is None]
    if missing:
        names = ", ".join(f"{v.contract} at {v.address}" for v in missing)
        return f"no contract code at the contracts file's addresses ({names}): the file names another chain's deployment"
    foreign = [v for v in found if v.version not in SPOKEN_VERSIONS]
    if foreign:
        spoken = ", ".join(str(v) for v in sorted(SPOKEN_VERSIONS))
        names = ", ".join(f"{v.contract} speaks protocol version {v.version}" for v in foreign)
        return (
            f"{names}; this node speaks version {spoken} only: upgrade the node to a release that "
            "speaks it (docs/OPERATIONS.md, Upgrades)"
        )
    return None
