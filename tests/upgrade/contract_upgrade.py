"""The contract-upgrade harness: the previous release's contracts beside this release's, on one chain.

A consortium moving to a new contract version keeps its members, its datasets (ids, owners,
commitments, samples, privacy caps), the privacy already spent on each, and its grants, while its
old jobs finish (and stay readable) on the old contracts (docs/OPERATIONS.md, Upgrades). This
module deploys the previous release's compiled contracts (previous_release/contracts, the
artifacts of 9e773ff), fills them as a consortium would (members admitted by vote, a dataset
each, a grant, a DP job running with spends), reads that state back through each version's own
views, and carries it over as the procedure does: this release's contracts deployed with the old
ones as predecessors (``deploy_contracts(predecessor=...)``), the import run by anyone
(backend/ledger/upgrade.py), confirmed by the members, and the grants issued again by their owners
(version 1 kept wrapped keys only in its events).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from web3 import Web3

from backend.ledger.artifacts import Artifact
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger
from backend.ledger.resources import Deployment
from backend.ledger.upgrade import carry_over as import_predecessor
from backend.ledger.upgrade import confirm_import

PREVIOUS = Path(__file__).resolve().parent / "previous_release" / "contracts"
MAX_SPEND = 400_000  # the old job's bound on one release (micro-epsilon)
MEMBERS = 3  # the consortium the tests carry over (tests/upgrade/conftest.py)


@dataclass(frozen=True)
class ConsortiumState:
    members: dict[str, tuple]  # address -> (name, endpoint, pubkey, overlay, status)
    datasets: dict[int, tuple]  # id -> (owner, samples, privacy cap, privacy spent, commitment)
    grants: frozenset[tuple[int, str]]  # (dataset id, grantee)


def previous_artifact(name: str) -> Artifact:
    data = json.loads((PREVIOUS / f"{name}.json").read_text())
    return Artifact(name=name, abi=data["abi"], bytecode=bytes.fromhex(data["bytecode"].removeprefix("0x")))


def contract(w3: Web3, address: str, abi: list):
    return w3.eth.contract(address=Web3.to_checksum_address(address), abi=abi)


def old_contract(w3: Web3, addresses: dict[str, str], name: str):
    return contract(w3, addresses[name], previous_artifact(name).abi)


def transact(w3: Web3, account, call) -> dict:
    tx = call.build_transaction(
        {"from": account.address, "nonce": w3.eth.get_transaction_count(account.address), "gas": 8_000_000}
    )
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    )
    assert receipt["status"] == 1, receipt
    return receipt


def deploy_previous(w3: Web3, deployer) -> dict[str, str]:
    """The previous release's three contracts, wired as its `ledger deploy` wired them."""

    def deploy(name: str, *args) -> str:
        artifact = previous_artifact(name)
        factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
        return transact(w3, deployer, factory.constructor(*args))["contractAddress"]

    registry = deploy("NodeRegistry", 51)
    data = deploy("DataRegistry", registry)
    fl = deploy("FederatedLearning", registry, data, True)
    transact(w3, deployer, old_contract(w3, {"DataRegistry": data}, "DataRegistry").functions.wireSpender(fl))
    return {"NodeRegistry": registry, "DataRegistry": data, "FederatedLearning": fl}


def previous_deployment(w3: Web3, addresses: dict[str, str]) -> Deployment:
    """The old contracts as a contracts file names them (what `deploy --upgrade-from` reads)."""
    return Deployment(chain_id=w3.eth.chain_id, block=1, addresses=dict(addresses))


def populate(w3: Web3, addresses: dict[str, str], members: list) -> None:
    """Members admitted by votes, a dataset each (member i owns dataset i + 1) with its cap, a grant
    of dataset 1 to member 1."""
    from devnet.consortium import overlay_of, public_key

    registry = old_contract(w3, addresses, "NodeRegistry")
    data = old_contract(w3, addresses, "DataRegistry")
    for i, member in enumerate(members):
        call = registry.functions.registerNode(
            f"org-{i}", f"http://org-{i}.test", public_key(member), overlay_of(member.address)
        )
        transact(w3, member, call)
        for voter in members[:i]:
            if registry.functions.isMember(member.address).call():
                break
            transact(w3, voter, registry.functions.voteAdmission(member.address))
    for i, member in enumerate(members):
        content = Web3.keccak(text=f"dataset of org-{i}")
        no_holdout = b"\0" * 32
        transact(
            w3,
            member,
            data.functions.registerDataset(content, content, content, 1000 + i, 5_000_000 + i, no_holdout),
        )
    transact(w3, members[0], data.functions.grant(1, members[1].address, b"\x01" * 113))


def start_old_job(w3: Web3, addresses: dict[str, str], members: list) -> int:
    """A DP job on the old contracts, running: every member joined with its own dataset, the job
    started by member 0, each participant's first release of round 1 recorded (spendPrivacy)."""
    fl = old_contract(w3, addresses, "FederatedLearning")
    now = w3.eth.get_block("latest")["timestamp"]
    spec = (
        b"\x01" * 32,  # configHash
        b"\x11" * 32,  # initialModelRef
        b"\x22" * 32,  # initialModelHash
        2,  # rounds
        1,  # committeeSize (a development deployment)
        1,  # topK
        1,  # minTrainers
        False,  # useBlocks
        now + 3600,  # joinDeadline
        600,  # trainPeriod
        600,  # scorePeriod
        MAX_SPEND,  # maxSpendPerRound
        0,  # margin
    )
    transact(w3, members[0], fl.functions.proposeJob(spec))
    job = fl.functions.jobCount().call()
    for i, member in enumerate(members):
        transact(w3, member, fl.functions.join(job, i + 1))
    transact(w3, members[0], fl.functions.startJob(job))
    for i, member in enumerate(members):
        spend_on_old_job(w3, addresses, member, job, 1000 * (i + 1))
    return job


def spend_on_old_job(w3: Web3, addresses: dict[str, str], member, job: int, amount: int) -> None:
    """A release the old job records on the member's dataset (a job finishing on the old contracts)."""
    fl = old_contract(w3, addresses, "FederatedLearning")
    transact(w3, member, fl.functions.spendPrivacy(job, 1, amount))


def read_old_state(w3: Web3, addresses: dict[str, str]) -> ConsortiumState:
    """The consortium as the version 1 contracts hold it (a dataset had its own spend)."""
    registry = old_contract(w3, addresses, "NodeRegistry")
    data = old_contract(w3, addresses, "DataRegistry")
    members = {a: tuple(registry.functions.getNode(a).call()) for a in registry.functions.members().call()}
    datasets, grants = {}, set()
    for dataset_id in range(1, data.functions.datasetCount().call() + 1):
        owner, samples, cap, spent, content_hash = data.functions.getDataset(dataset_id).call()[:5]
        datasets[dataset_id] = (owner, samples, cap, spent, bytes(content_hash))
        grants |= {(dataset_id, m) for m in members if data.functions.isGranted(dataset_id, m).call()}
    return ConsortiumState(members, datasets, frozenset(grants))


def read_new_state(ledger: Ledger) -> ConsortiumState:
    """The consortium as this release's contracts hold it (spends counted per budget source)."""
    nodes, data = ledger.nodes, ledger.data
    members = {}
    for address in nodes.members():
        info = nodes.get_node(address)
        members[address] = (info.name, info.endpoint, info.pubkey, info.overlay, int(info.status))
    datasets, grants = {}, set()
    for dataset_id in range(1, data.dataset_count() + 1):
        ds = data.get_dataset(dataset_id)
        spent = data.get_source(ds.source_id).spent
        datasets[dataset_id] = (ds.owner, ds.samples, ds.privacy_cap, spent, bytes(ds.commitment))
        grants |= {(dataset_id, m) for m in members if data.is_granted(dataset_id, m)}
    return ConsortiumState(members, datasets, frozenset(grants))


def old_grants(w3: Web3, addresses: dict[str, str]) -> list[tuple[int, str, str, bytes]]:
    """(dataset id, owner, grantee, wrapped key) of every grant still active on the old contracts:
    version 1 kept the wrapped key only in its AccessGranted event."""
    data = old_contract(w3, addresses, "DataRegistry")
    events = data.events.AccessGranted().get_logs(from_block=0)
    return [
        (e.args.datasetId, e.args.owner, e.args.grantee, bytes(e.args.wrappedKey))
        for e in events
        if data.functions.isGranted(e.args.datasetId, e.args.grantee).call()
    ]


def carry_over(
    w3: Web3,
    old: dict[str, str],
    new: Ledger,
    members: list[Ledger],
    *,
    confirmations: int | None = None,
    regrant: bool = True,
) -> None:
    """The upgrade procedure after `deploy --upgrade-from`: anyone imports (here the deployer),
    ``confirmations`` members (default: all) confirm after their nodes' checks, and (``regrant``)
    each owner grants again what it had granted: its node does so from its own records
    (backend.datasets.services.regrant_carried, tests/upgrade/test_regrant_after_upgrade.py);
    here from the old contracts' events."""
    import_predecessor(new)
    runs_on = previous_deployment(w3, old)
    for member in members[: len(members) if confirmations is None else confirmations]:
        if member.nodes.import_open():
            confirm_import(member, runs_on)
    if not regrant:
        return
    by_address = {m.client.address: m for m in members}
    for dataset_id, owner, grantee, wrapped in old_grants(w3, old):
        cap = new.data.get_dataset(dataset_id).privacy_cap
        by_address[owner].data.grant(dataset_id, grantee, wrapped, cap)


def member_ledgers(w3: Web3, accounts: list, deployment: Deployment) -> list[Ledger]:
    return [Ledger(ChainClient(w3, account), deployment) for account in accounts]
