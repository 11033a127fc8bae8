"""Deploying the contracts, recording their addresses, and the Ledger facade over them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .artifacts import load_artifact
from .client import ChainClient
from .contracts import CommitteeRuleHarness, DataRegistry, FederatedLearning, NodeRegistry
from .errors import LedgerConfigError
from .resources import Deployment

DEFAULT_ADMISSION_THRESHOLD_PCT = 51  # a majority of the members


def deploy_contracts(
    client: ChainClient,
    *,
    admission_threshold_pct: int = DEFAULT_ADMISSION_THRESHOLD_PCT,
    with_harness: bool = False,
    allow_small_committees: bool = False,
) -> Deployment:
    """Deploy NodeRegistry, DataRegistry and FederatedLearning, wired (and the rule harness for tests).

    ``allow_small_committees``: a development deployment whose jobs may have committees of 1, 2 or
    an even size (a production one refuses them: one member would fix models alone). Immutable.
    """
    start = client.block_number()
    registry = _deploy(client, "NodeRegistry", admission_threshold_pct)
    data = _deploy(client, "DataRegistry", registry)
    fl = _deploy(client, "FederatedLearning", registry, data, allow_small_committees)
    # Only FederatedLearning records privacy spends (it checks participant and plan): wired once.
    DataRegistry(data, client).wire_spender(fl)
    addresses = {"NodeRegistry": registry, "DataRegistry": data, "FederatedLearning": fl}
    if with_harness:
        addresses["CommitteeRuleHarness"] = _deploy(client, "CommitteeRuleHarness")
    return Deployment(chain_id=client.chain_id, block=start + 1, addresses=addresses)


def _deploy(client: ChainClient, name: str, *args: object) -> str:
    """Deploy one contract; its address (a creation receipt always carries one)."""
    address = client.deploy(load_artifact(name), *args).contract_address
    if address is None:
        raise LedgerConfigError(f"deploying {name}: the receipt names no contract address")
    return address


def save_deployment(deployment: Deployment, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    record = {"chain_id": deployment.chain_id, "block": deployment.block, "contracts": deployment.addresses}
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def load_deployment(path: str | Path) -> Deployment | None:
    path = Path(path)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        return Deployment(
            chain_id=int(record["chain_id"]), block=int(record["block"]), addresses=record["contracts"]
        )
    except (ValueError, KeyError, TypeError) as exc:
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

    def for_account(self, client: ChainClient) -> Ledger:
        """The same contracts, used by another account (tests, tools)."""
        return Ledger(client, self.deployment)
