"""Carrying a consortium over to a new contract version: the import, its checks, its confirmation.

The new NodeRegistry and DataRegistry are deployed with their predecessors (deployment.py,
``deploy_contracts(predecessor=...)``) and import what the chain says: the predecessor's members,
its datasets with their ids, caps and spent privacy. Anyone may run ``carry_over`` (the contracts
read the data from the predecessor's views; nobody's word is taken). The import closes when the
imported members confirm it by the admission threshold; before a member confirms, its node checks
what a hostile deployer could have got wrong (``upgrade_problems``): that the code at every address
is this release's, that the new contracts name the deployment the member itself runs on as their
predecessor and are wired to each other, that the admission threshold is the predecessor's, and
that the import is complete. The contracts refuse a confirmation of an incomplete import
themselves. docs/OPERATIONS.md, Upgrades, gives the whole procedure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eth_utils import to_checksum_address

from .artifacts import load_artifact
from .client import ChainClient
from .contracts import DataRegistry, FederatedLearning, NodeRegistry
from .deployment import Ledger
from .errors import LedgerError
from .resources import Deployment, TxReceipt
from .versions import check_deployment

# Accounts / datasets one import transaction carries (a consortium has tens of members; a member
# costs ~150k gas, a dataset ~200k: a batch stays far below a block's gas limit).
MEMBER_BATCH = 20
DATASET_BATCH = 20
_IMMUTABLE_SLOT = re.compile(rb"\x00{32,}")
# The contracts deployed by deploy_contracts whose code a member checks (the rule harness is tests').
CHECKED_CONTRACTS = ("NodeRegistry", "DataRegistry", "JobLogic", "FederatedLearning")


class UpgradeRefused(LedgerError):
    """The new deployment is not one this node may confirm (the reasons are in the message)."""


@dataclass(frozen=True)
class ImportStatus:
    open: bool
    members: int  # imported members (members of the new registry)
    predecessor_members: int
    members_complete: bool  # the same set as the predecessor's
    datasets: int  # imported datasets
    predecessor_datasets: int

    @property
    def complete(self) -> bool:
        return self.members_complete and self.datasets == self.predecessor_datasets

    def as_dict(self) -> dict:
        return {
            "open": self.open,
            "members": self.members,
            "predecessor_members": self.predecessor_members,
            "members_complete": self.members_complete,
            "datasets": self.datasets,
            "predecessor_datasets": self.predecessor_datasets,
            "complete": self.complete,
        }


def _predecessors(ledger: Ledger) -> tuple[NodeRegistry, DataRegistry]:
    nodes_before, data_before = ledger.nodes.predecessor(), ledger.data.predecessor()
    if nodes_before is None or data_before is None:
        raise UpgradeRefused(
            "these contracts were deployed without a predecessor: there is nothing to import"
        )
    return NodeRegistry(nodes_before, ledger.client), DataRegistry(data_before, ledger.client)


def import_status(ledger: Ledger) -> ImportStatus:
    old_nodes, old_data = _predecessors(ledger)
    return ImportStatus(
        open=ledger.nodes.import_open(),
        members=ledger.nodes.member_count(),
        predecessor_members=old_nodes.member_count(),
        members_complete=ledger.nodes.members_complete(),
        datasets=ledger.data.imported_count(),
        predecessor_datasets=old_data.dataset_count(),
    )


def carry_over(ledger: Ledger) -> ImportStatus:
    """Import every member and dataset of the predecessor, or bring an import up to date (members
    admitted or gone there since, endpoints changed, datasets registered and privacy spent since).
    Any account may run it while the import is open; it sends only what the chain already says."""
    old_nodes, old_data = _predecessors(ledger)
    if not ledger.nodes.import_open():
        raise UpgradeRefused("the import is closed: the members confirmed it")
    theirs = old_nodes.members()
    gone = [a for a in ledger.nodes.members() if a not in set(theirs)]  # dropped by importMembers
    accounts = theirs + gone
    for start in range(0, len(accounts), MEMBER_BATCH):
        ledger.nodes.import_members(accounts[start : start + MEMBER_BATCH])
    count = old_data.dataset_count()
    for first in range(1, count + 1, DATASET_BATCH):
        ledger.data.import_datasets(first, min(first + DATASET_BATCH - 1, count))
    return import_status(ledger)


def code_matches(expected: bytes, deployed: bytes) -> bool:
    """``deployed`` is ``expected`` (an artifact's runtime code) but for its immutables: solc leaves
    each immutable as 32 zero bytes in the artifact, filled at deployment. A byte may differ only
    inside such a run of zeros; everything else (every instruction) must be the same."""
    if len(expected) != len(deployed):
        return False
    free = bytearray(len(expected))
    for run in _IMMUTABLE_SLOT.finditer(expected):
        free[run.start() : run.end()] = b"\x01" * (run.end() - run.start())
    return all(a == b or free[i] for i, (a, b) in enumerate(zip(expected, deployed, strict=True)))


def _code(client: ChainClient, address: str) -> bytes:
    return bytes(client.read(lambda: client.w3.eth.get_code(to_checksum_address(address))))


def _address_view(contract, function: str) -> str:
    return to_checksum_address(contract.client.call(contract.encode(function))[0])


def allows_small_committees(client: ChainClient, deployment: Deployment) -> bool:
    """The deployment's FederatedLearning takes committees of 1, 2 or an even size (a development
    one); every protocol version has the view."""
    fl = FederatedLearning(deployment.address("FederatedLearning"), client)
    return bool(client.call(fl.encode("allowSmallCommittees"))[0])


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and to_checksum_address(a) == to_checksum_address(b)


def upgrade_problems(ledger: Ledger, runs_on: Deployment) -> list[str]:
    """What forbids this node to confirm the import of ``ledger``'s deployment; empty when nothing.

    ``runs_on``: the deployment this node runs on now (its contracts file), which must be the
    one the new contracts import from."""
    deployment, client = ledger.deployment, ledger.client
    problems = []
    if deployment.chain_id != client.chain_id or runs_on.chain_id != client.chain_id:
        return [
            f"the contracts files name chain {deployment.chain_id} / {runs_on.chain_id}, not {client.chain_id}"
        ]
    for name in CHECKED_CONTRACTS:
        if name not in deployment.addresses:
            problems.append(f"the new contracts file names no {name}")
            continue
        runtime = load_artifact(name, deployment.evm_version).deployed_bytecode
        if not code_matches(runtime, _code(client, deployment.address(name))):
            problems.append(f"the code at {name} {deployment.address(name)} is not this release's {name}")
    if problems:
        return problems  # the views below mean nothing on code that is not ours
    if (reason := check_deployment(ledger)) is not None:
        problems.append(reason)
    nodes, data, fl = ledger.nodes, ledger.data, ledger.fl
    old = runs_on.addresses
    if not _same(nodes.predecessor(), old.get("NodeRegistry")):
        problems.append(
            f"the new NodeRegistry imports from {nodes.predecessor()}, not this node's {old.get('NodeRegistry')}"
        )
    if not _same(data.predecessor(), old.get("DataRegistry")):
        problems.append(
            f"the new DataRegistry imports from {data.predecessor()}, not this node's {old.get('DataRegistry')}"
        )
    if deployment.previous is None or deployment.previous.addresses != old:
        problems.append("the new contracts file's previous deployment is not the one this node runs on")
    if not _same(data.registry(), nodes.address) or not _same(nodes.data_import(), data.address):
        problems.append("the new NodeRegistry and DataRegistry are not wired to each other")
    if not _same(data.spender(), fl.address) or not (
        _same(_address_view(fl, "registry"), nodes.address)
        and _same(_address_view(fl, "dataRegistry"), data.address)
    ):
        problems.append("the new FederatedLearning is not wired to the new registries")
    if "FederatedLearning" in old and allows_small_committees(client, deployment) != allows_small_committees(
        client, runs_on
    ):
        problems.append(
            "the new FederatedLearning does not take the consortium's committee sizes (allowSmallCommittees)"
        )
    if "FederatedLearning" in old:
        previous_jobs = FederatedLearning(old["FederatedLearning"], client).job_count()
        if fl.job_count() < previous_jobs:
            problems.append(
                f"the new FederatedLearning numbers its jobs from {fl.job_count() + 1}, under the "
                f"{previous_jobs} jobs of the one this node runs on: new jobs would take old jobs' ids"
            )
    previous_nodes = NodeRegistry(old["NodeRegistry"], client) if "NodeRegistry" in old else None
    if previous_nodes is not None and nodes.threshold_percent() != previous_nodes.threshold_percent():
        problems.append(
            f"the new admission threshold is {nodes.threshold_percent()}%, the consortium's "
            f"{previous_nodes.threshold_percent()}%"
        )
    if problems:
        return problems
    status = import_status(ledger)
    if not status.open:
        problems.append("the import is closed already")
    elif not status.complete:
        problems.append(
            f"the import is not complete: {status.members} of {status.predecessor_members} members"
            f"{'' if status.members_complete else ' (not the same set)'}, {status.datasets} of "
            f"{status.predecessor_datasets} datasets (run `manage.py ledger import`)"
        )
    return problems


def confirm_import(ledger: Ledger, runs_on: Deployment) -> TxReceipt:
    """This member's confirmation of the import, after the checks (UpgradeRefused names what failed)."""
    problems = upgrade_problems(ledger, runs_on)
    if problems:
        raise UpgradeRefused("; ".join(problems))
    return ledger.nodes.confirm_import()
