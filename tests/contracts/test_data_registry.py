"""DataRegistry: dataset records, grants (wrapped key only in the event), revocation, privacy caps."""

from __future__ import annotations

import pytest

from backend.ledger import errors


def test_register_dataset(fed):
    data = fed.member(0).data
    with pytest.raises(errors.NotMember):
        fed.outsider().data.register_dataset(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 5, 10)
    with pytest.raises(errors.InvalidDataset):
        data.register_dataset(b"\x00" * 32, b"\x02" * 32, b"\x03" * 32, 5, 10)
    with pytest.raises(errors.InvalidDataset):
        data.register_dataset(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 0, 10)
    dataset_id = data.register_dataset(b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32, 500, 2_000_000)
    info = data.get_dataset(dataset_id)
    assert info.owner == fed.address(0) and info.samples == 500 and info.swarm_ref == b"\x0b" * 32
    assert info.privacy_cap == 2_000_000 and info.privacy_spent == 0
    with pytest.raises(errors.UnknownDataset):
        data.get_dataset(10_000)


def test_grant_and_revoke(fed):
    owner, grantee = fed.member(0).data, fed.address(1)
    with pytest.raises(errors.NotDatasetOwner):
        fed.member(1).data.grant(1, grantee, b"key")
    with pytest.raises(errors.NotMember):
        owner.grant(1, fed.outsider().client.address, b"key")
    with pytest.raises(errors.NotGranted):
        owner.revoke(1, grantee)
    receipt = owner.grant(1, grantee, b"\xee" * 97)
    assert receipt.event("AccessGranted").args["wrappedKey"] == "0x" + "ee" * 97
    assert owner.is_granted(1, grantee) and owner.can_use(1, grantee)
    owner.revoke(1, grantee)
    assert not owner.can_use(1, grantee)
    assert owner.can_use(1, fed.address(0))


def test_privacy_spend_is_capped(fed):
    owner = fed.member(0).data  # dataset 1, cap 3_000_000 micro-epsilon
    owner.spend_privacy(1, 7, 1_000_000)
    owner.spend_privacy(1, 8, 1_500_000)
    with pytest.raises(errors.PrivacyBudgetExceeded) as caught:
        owner.spend_privacy(1, 7, 600_000)
    assert caught.value.args_ == {"datasetId": 1, "spent": 2_500_000, "requested": 600_000, "cap": 3_000_000}
    with pytest.raises(errors.NotGranted):
        fed.member(1).data.spend_privacy(1, 7, 1)
    owner.grant(1, fed.address(1), b"k")
    receipt = fed.member(1).data.spend_privacy(1, 7, 500_000)
    assert receipt.event("PrivacySpent").args["jobTotal"] == 1_500_000
    assert owner.privacy_spent_by_job(1, 7) == 1_500_000
    assert owner.get_dataset(1).privacy_spent == 3_000_000
