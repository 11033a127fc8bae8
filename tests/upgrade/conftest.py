"""The contract-upgrade tests' chain: the previous release's contracts filled as a consortium fills
them (3 members, a dataset each, a grant, a DP job running with spends) and this release's
deployed beside them with the old ones as predecessors, the import not run yet. Each test runs
on a snapshot of that state, reverted afterwards."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.ledger.chains import ensure_funds, new_in_process_chain
from backend.ledger.client import ChainClient
from backend.ledger.deployment import deploy_contracts
from devnet.consortium import dev_account
from tests.upgrade.contract_upgrade import (
    MEMBERS,
    deploy_previous,
    member_ledgers,
    populate,
    previous_deployment,
    start_old_job,
)


@pytest.fixture(scope="module")
def upgrade_base():
    w3 = new_in_process_chain()
    accounts = [dev_account(i, "contract-upgrade") for i in range(MEMBERS + 1)]  # the last: no member
    for account in accounts:
        ensure_funds(w3, account.address)
    old = deploy_previous(w3, accounts[0])
    populate(w3, old, accounts[:MEMBERS])
    job = start_old_job(w3, old, accounts[:MEMBERS])
    new = deploy_contracts(
        ChainClient(w3, accounts[0]), allow_small_committees=True, predecessor=previous_deployment(w3, old)
    )
    ledgers = member_ledgers(w3, accounts, new)
    return SimpleNamespace(w3=w3, accounts=accounts, old=old, new=new, job=job, ledgers=ledgers)


@pytest.fixture
def chain(upgrade_base):
    tester = upgrade_base.w3.provider.ethereum_tester
    snapshot = tester.take_snapshot()
    yield upgrade_base
    tester.revert_to_snapshot(snapshot)
    for ledger in upgrade_base.ledgers:
        ledger.client.nonces.reset()
