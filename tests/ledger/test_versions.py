"""The protocol version of the deployed contracts: read, and refused when this node does not speak it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.ledger.artifacts import Artifact
from backend.ledger.chains import ensure_funds, new_in_process_chain
from backend.ledger.client import ChainClient
from backend.ledger.deployment import deploy_contracts
from backend.ledger.versions import SPOKEN_VERSIONS, check_deployment, deployed_versions, read_version
from devnet.consortium import dev_account

PREVIOUS = Path(__file__).resolve().parents[1] / "upgrade" / "previous_release" / "contracts"
# Runtime code answering every call with the word 99: a contract of a protocol no node speaks.
VERSION_99 = bytes.fromhex("69" + "6063600052602060" + "00f3" + "600052600a6016f3")


@pytest.fixture(scope="module")
def client() -> ChainClient:
    w3 = new_in_process_chain()
    account = dev_account(0, "versions")
    ensure_funds(w3, account.address)
    return ChainClient(w3, account)


def _previous(name: str) -> Artifact:
    data = json.loads((PREVIOUS / f"{name}.json").read_text())
    return Artifact(name=name, abi=data["abi"], bytecode=bytes.fromhex(data["bytecode"].removeprefix("0x")))


def _ledger(client, addresses: dict[str, str]):
    return SimpleNamespace(client=client, deployment=SimpleNamespace(addresses=addresses))


def test_this_release_speaks_the_version_of_its_own_contracts(client):
    deployment = deploy_contracts(client)
    ledger = _ledger(client, deployment.addresses)
    assert {v.version for v in deployed_versions(ledger)} <= SPOKEN_VERSIONS
    assert check_deployment(ledger) is None


def test_contracts_without_a_version_constant_are_version_1(client):
    registry = client.deploy(_previous("NodeRegistry"), 51).contract_address
    data = client.deploy(_previous("DataRegistry"), registry).contract_address
    fl = client.deploy(_previous("FederatedLearning"), registry, data, True).contract_address
    ledger = _ledger(client, {"NodeRegistry": registry, "DataRegistry": data, "FederatedLearning": fl})
    assert [v.version for v in deployed_versions(ledger)] == [1, 1, 1]
    assert check_deployment(ledger) is None  # this release still speaks the previous one's protocol


def test_a_version_this_node_does_not_speak_is_refused_with_the_reason(client):
    foreign = client.deploy(Artifact("Version99", [], VERSION_99)).contract_address
    assert read_version(client, foreign) == 99
    deployment = deploy_contracts(client)
    addresses = dict(deployment.addresses, FederatedLearning=foreign)
    problem = check_deployment(_ledger(client, addresses))
    assert problem is not None
    spoken = ", ".join(str(v) for v in sorted(SPOKEN_VERSIONS))
    assert problem.startswith(
        f"FederatedLearning speaks protocol version 99; this node speaks version {spoken} only"
    )
    assert "docs/OPERATIONS.md" in problem


def test_addresses_without_code_name_another_chains_deployment(client):
    nowhere = "0x" + "12" * 20
    problem = check_deployment(_ledger(client, {"NodeRegistry": nowhere}))
    assert problem is not None and "no contract code" in problem and nowhere in problem
