"""Deploying the contracts, recording their addresses, and the Ledger facade over them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from .artifacts import DEFAULT_EVM_VERSION, UnknownEvmVersion, check_evm_version, load_artifact
from .client import ChainClient
from .contracts import CommitteeRuleHarness, DataRegistry, FederatedLearning, NodeRegistry
from .errors import LedgerConfigError
from .previous import PreviousLedger
from .resources import Deployment

DEFAULT_ADMISSION_THRESHOLD_PCT = 51  # a majority of the members
NO_PREDECESSOR = "0x" + "00" * 20


def deploy_contracts(
    client: ChainClient,
    *,
    admission_threshold_pct: int = DEFAULT_ADMISSION_THRESHOLD_PCT,
    with_harness: bool = False,
    allow_small_committees: bool = False,
    evm_version: str = DEFAULT_EVM_VERSION,
    predecessor: Deployment | None = None,
) -> Deployment:
    """Deploy NodeRegistry, DataRegistry, JobLogic and FederatedLearning, wired (and the rule harness for tests).

    ``allow_small_committees``: a development deployment whose jobs may have committees of 1, 2 or
    an even size (a production one refuses them: one member would fix models alone). Immutable.
    ``evm_version``: the hardfork the chain runs (artifacts.EVM_VERSIONS): the bytecode compiled
    for it is deployed (the ABI is the same for every target).
    ``predecessor``: the deployment a consortium upgrades from (docs/OPERATIONS.md, Upgrades): the
    new registries import its members and datasets (backend/ledger/upgrade.py carries them) and
    take no other write until the members confirm; it is recorded as the new one's ``previous``.
    """
    try:
        check_evm_version(evm_version)
    except UnknownEvmVersion as exc:
        raise LedgerConfigError(str(exc)) from None
    if predecessor is not None and not deployment_is_live(predecessor, client):
        raise LedgerConfigError(
            f"the deployment to upgrade from is not on chain {client.chain_id} (no code at its addresses)"
        )
    old = predecessor.addresses if predecessor is not None else {}
    start = client.block_number()
    registry = _deploy(
        client, "NodeRegistry", evm_version, admission_threshold_pct, old.get("NodeRegistry", NO_PREDECESSOR)
    )
    data = _deploy(client, "DataRegistry", evm_version, registry, old.get("DataRegistry", NO_PREDECESSOR))
    # FederatedLearning runs JobLogic's steps (proposals, draws, round decisions) on its own storage
    # by DELEGATECALL: its code, kept apart so each contract stays well below the size limit.
    logic = _deploy(client, "JobLogic", evm_version)
    # Job ids continue after the predecessor's: every node keys its records by job id.
    first_job_id = (
        FederatedLearning(old["FederatedLearning"], client).job_count() if "FederatedLearning" in old else 0
    )
    fl = _deploy(
        client, "FederatedLearning", evm_version, registry, data, allow_small_committees, logic, first_job_id
    )
    # Only FederatedLearning records privacy spends (it checks participant and plan): wired once.
    DataRegistry(data, client).wire_spender(fl)
    if predecessor is not None:  # the import closes only once this DataRegistry carried every dataset
        NodeRegistry(registry, client).wire_data_import(data)
    addresses = {"NodeRegistry": registry, "DataRegistry": data, "JobLogic": logic, "FederatedLearning": fl}
    if with_harness:
        addresses["CommitteeRuleHarness"] = _deploy(client, "CommitteeRuleHarness", evm_version)
    return Deployment(
        chain_id=client.chain_id,
        block=start + 1,
        addresses=addresses,
        evm_version=evm_version,
        previous=replace(predecessor, previous=None) if predecessor is not None else None,
    )


def _deploy(client: ChainClient, name: str, evm_version: str, *args: object) -> str:
    """Deploy one contract; its address (a creation receipt always carries one)."""
    address = client.deploy(load_artifact(name, evm_version), *args).contract_address
    if address is None:
        raise LedgerConfigError(f"deploying {name}: the receipt names no contract address")
    return address


def save_deployment(deployment: Deployment, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    record = _record(deployment)
    if deployment.previous is not None:
        record["previous"] = _record(deployment.previous)
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def _record(deployment: Deployment) -> dict:
    return {
        "chain_id": deployment.chain_id,
        "block": deployment.block,
        "evm_version": deployment.evm_version,
        "contracts": deployment.addresses,
    }


def _deployment(record: dict, previous: Deployment | None = None) -> Deployment:
    addresses = record["contracts"]
    if not isinstance(addresses, dict) or not all(isinstance(a, str) for a in addresses.values()):
        raise TypeError("contracts must map names to addresses")
    return Deployment(
        chain_id=int(record["chain_id"]),
        block=int(record["block"]),
        addresses=addresses,
        evm_version=str(record.get("evm_version", DEFAULT_EVM_VERSION)),
        previous=previous,
    )


def load_deployment(path: str | Path) -> Deployment | None:
    """The contracts file's deployment, with the one it upgraded from as ``previous`` (if any)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        previous = _deployment(record["previous"]) if record.get("previous") is not None else None
        return _deployment(record, previous)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerConfigError(f"{path} is not a contracts file: {exc}") from exc


def deployment_is_live(deployment: Deployment, client: ChainClient) -> bool:
    """The recorded contracts exist on the chain the client talks to."""
    return deployment.chain_id == client.chain_id and all(
        client.has_code(address) for address in deployment.addresses.values()
    )


@dataclass
class Ledger:
    """This node's view of the chain: the client and the three contracts."""

    client: ChainClient
    deployment: Deployment

    @cached_property
    def nodes(self) -> NodeRegistry:
        return NodeRegistry(self.deployment.address("NodeRegistry"), self.client)

    @cached_property
    def data(self) -> DataRegistry:
        return DataRegistry(self.deployment.address("DataRegistry"), self.client)

    @cached_property
    def fl(self) -> FederatedLearning:
        return FederatedLearning(self.deployment.address("FederatedLearning"), self.client)

    @cached_property
    def rule(self) -> CommitteeRuleHarness:
        return CommitteeRuleHarness(self.deployment.address("CommitteeRuleHarness"), self.client)

    @cached_property
    def previous(self) -> PreviousLedger | None:
        """The deployment this one carried the consortium over from, read-only (its old jobs)."""
        if self.deployment.previous is None:
            return None
        return PreviousLedger(self.client, self.deployment.previous)

    def for_account(self, client: ChainClient) -> Ledger:
        """The same contracts, used by another account (tests, tools)."""
        return Ledger(client, self.deployment)
