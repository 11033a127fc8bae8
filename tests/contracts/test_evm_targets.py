"""The contracts run on the hardfork a deployment names (issue 38): london, shanghai and cancun.

Each target's compiled bytecode (contracts/artifacts/[<target>/]) is deployed on an anvil set
to that hardfork and runs a whole job of one round, with the same helpers as the contract tests
(``Federation``, built over that anvil): propose, join, start, draw, train, score, finalize, fix
the global model. And the default (cancun) bytecode does not even deploy on london, which has
no PUSH0: the choice is not cosmetic.
"""

from __future__ import annotations

import pytest
from web3 import HTTPProvider, Web3

from backend.ledger import errors
from backend.ledger.artifacts import EVM_VERSIONS, load_artifact
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, deploy_contracts
from backend.ledger.resources import JobStatus
from devnet.anvil import AnvilProcess
from devnet.consortium import bootstrap_consortium, dev_account

pytestmark = pytest.mark.integration
MEMBERS = 5
REF, MODEL = b"\x11" * 32, b"\x33" * 32


def _members(anvil: AnvilProcess, evm_version: str) -> list[Ledger]:
    clients = []
    for i in range(MEMBERS):
        account = dev_account(i, f"evm-{evm_version}")
        anvil.fund(account.address)
        clients.append(ChainClient(Web3(HTTPProvider(anvil.url)), account))
    deployment = deploy_contracts(clients[0], with_harness=True, evm_version=evm_version)
    assert deployment.evm_version == evm_version
    ledgers = [Ledger(client, deployment) for client in clients]
    bootstrap_consortium(ledgers, [f"http://evm{i}.test" for i in range(MEMBERS)])
    for i, ledger in enumerate(ledgers):
        ledger.data.register_dataset(
            bytes([i + 1]) * 32, bytes([i + 2]) * 32, b"\x05" * 32, 100 + i, 3_000_000
        )
    return ledgers


@pytest.mark.parametrize("evm_version", EVM_VERSIONS)
def test_a_round_runs_on_the_hardfork_the_deployment_names(evm_version, federation_base):
    with AnvilProcess(extra_args=("--hardfork", evm_version)) as anvil:
        assert anvil.rpc("web3_clientVersion")  # anvil took the hardfork name
        ledgers = _members(anvil, evm_version)
        fed = type(federation_base)(Web3(HTTPProvider(anvil.url)), ledgers, ledgers[0].rule)
        job, committee, trainers = fed.running_job(
            participants=MEMBERS, rounds=1, committee_size=3, top_k=2, min_trainers=2
        )
        for t in trainers:
            fed.member(t).fl.submit_update(job, 1, bytes([t + 1]) * 32, bytes([t + 100]) * 32, 10)
        fed.score(job, 1, {m: {fed.address(t): 6000 + t for t in trainers} for m in committee})
        aggregators = [fed.index(a) for a in fed.member(0).fl.committee(job)]
        for m in aggregators[:2]:  # a majority of three fixes the model
            fed.member(m).fl.vote_global_model(job, 1, REF, MODEL)

        state = fed.member(0).fl.get_job(job)
        assert state.status is JobStatus.FINISHED and state.model_hash == MODEL


def test_code_for_a_later_hardfork_does_not_run_on_london():
    assert load_artifact("NodeRegistry", "london").bytecode != load_artifact("NodeRegistry").bytecode
    with AnvilProcess(extra_args=("--hardfork", "london")) as anvil:
        account = dev_account(0, "evm-mismatch")
        anvil.fund(account.address)
        client = ChainClient(Web3(HTTPProvider(anvil.url)), account)
        with pytest.raises(errors.LedgerError):
            deploy_contracts(client, evm_version="cancun")
        assert deploy_contracts(client, evm_version="london").evm_version == "london"


def test_an_unknown_target_is_refused_in_one_sentence():
    with pytest.raises(errors.LedgerConfigError, match="not one the contracts are compiled for"):
        deploy_contracts(None, evm_version="osaka")  # type: ignore[arg-type]  # refused before any call
