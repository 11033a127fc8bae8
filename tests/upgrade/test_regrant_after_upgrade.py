"""A provider's node grants its datasets again once the consortium's import closed.

Version 1 kept a grant's wrapped key only in its AccessGranted event, so the new contracts carry
datasets without grants; the node holds each grant it issued (datasets.Grant, the wrapped key in
hex) and issues it again on the new contracts (backend.datasets.services.regrant_carried, run by
its agent).
"""

from __future__ import annotations

import pytest

from backend.datasets import services
from backend.datasets.models import Grant
from backend.ledger import access as ledger_access
from backend.ledger.deployment import Ledger
from tests.builders import stored_dataset
from tests.upgrade.contract_upgrade import MEMBERS, carry_over

pytestmark = pytest.mark.django_db


def test_the_owner_s_node_grants_again_after_the_import_closed(chain, monkeypatch):
    members = chain.ledgers[:MEMBERS]
    owner, grantee = members[0], chain.accounts[1].address
    # what member 0's node holds of its dataset 1 and of the grant it issued on the old contracts
    dataset = stored_dataset("carried", epsilon_cap=5.0, onchain_id="1", status="registered")
    Grant.objects.create(dataset=dataset, grantee=grantee, wrapped_key="01" * 113, tx_hash="0xold")
    revoked = chain.accounts[2].address  # a grant revoked here (and on the old contracts)
    Grant.objects.create(
        dataset=dataset, grantee=revoked, wrapped_key="02" * 113, revoked="2026-01-01T00:00Z"
    )
    monkeypatch.setattr(ledger_access, "node_ledger", lambda: Ledger(owner.client, chain.new))

    assert services.regrant_carried() is None  # the import is open: the contracts take no write
    carry_over(chain.w3, chain.old, owner, members, regrant=False)
    assert not owner.data.is_granted(1, grantee)

    assert services.regrant_carried() == 1
    assert owner.data.is_granted(1, grantee) and owner.data.get_grant(1, grantee).cap == 5_000_000
    assert Grant.objects.get(dataset=dataset, grantee=grantee).tx_hash != "0xold"
    assert not owner.data.is_granted(1, revoked)  # a grant revoked here stays revoked
    assert services.regrant_carried() == 0  # held already: nothing sent twice
