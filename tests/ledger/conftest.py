"""A small federation on a fresh in-process chain, shared by a module's tests."""

from __future__ import annotations

import pytest

from backend.ledger.chains import ensure_funds, new_in_process_chain
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, deploy_contracts
from devnet.consortium import bootstrap_consortium, dev_account


def make_federation(members: int = 5, seed: str = "ledger-tests") -> list[Ledger]:
    w3 = new_in_process_chain()
    accounts = [dev_account(i, seed) for i in range(members)]
    for account in accounts:
        ensure_funds(w3, account.address)
    clients = [ChainClient(w3, account) for account in accounts]
    deployment = deploy_contracts(clients[0], allow_small_committees=True)  # committees of 2 here
    ledgers = [Ledger(client, deployment) for client in clients]
    bootstrap_consortium(ledgers, [f"http://n{i}.test" for i in range(members)])
    return ledgers


@pytest.fixture(scope="module")
def federation() -> list[Ledger]:
    return make_federation()
