"""DataRegistry: dataset records, budget sources, grants (wrapped key only in the event, a cap each),
revocation that stops spends, key rotation, privacy caps, the release a registration makes."""

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
    dataset_id = data.register_dataset(b"\x6a" * 32, b"\x0b" * 32, b"\x0c" * 32, 500, 2_000_000)
    info = data.get_dataset(dataset_id)
    assert info.owner == fed.address(0) and info.samples == 500 and info.swarm_ref == b"\x0b" * 32
    assert info.privacy_cap == 2_000_000
    assert data.get_source(info.source_id).spent == 0
    with pytest.raises(errors.UnknownDataset):
        data.get_dataset(10_000)


def test_grant_and_revoke(fed):
    owner, grantee = fed.member(0).data, fed.address(1)
    with pytest.raises(errors.NotDatasetOwner):
        fed.member(1).data.grant(1, grantee, b"key", 1_000_000)
    with pytest.raises(errors.NotMember):
        owner.grant(1, fed.outsider().client.address, b"key", 1_000_000)
    with pytest.raises(errors.InvalidDataset):  # the owner needs no grant
        owner.grant(1, fed.address(0), b"key", 1_000_000)
    for cap in (0, 100_000_001):
        with pytest.raises(errors.InvalidDataset):
            owner.grant(1, grantee, b"key", cap)
    with pytest.raises(errors.NotGranted):
        owner.revoke(1, grantee)
    receipt = owner.grant(1, grantee, b"\xee" * 97, 1_500_000)
    granted = receipt.event("AccessGranted").args
    assert granted["wrappedKey"] == "0x" + "ee" * 97 and granted["cap"] == 1_500_000
    assert owner.is_granted(1, grantee) and owner.can_use(1, grantee)
    assert owner.get_grant(1, grantee).cap == 1_500_000
    assert owner.usage(1, grantee) == (100, False)
    owner.revoke(1, grantee)
    assert not owner.can_use(1, grantee) and owner.usage(1, grantee) == (0, False)
    assert owner.can_use(1, fed.address(0))


def test_a_providers_datasets_share_a_source_unless_declared_disjoint(fed):
    """Budgets per source: a provider's second dataset (a copy, rescaled, jittered: no hash tells)
    spends from the same budget as its first, whose cap is the smaller of the two; a dataset
    declared disjoint gets its own, and the declaration is on chain."""
    data = fed.member(0).data
    first = data.get_dataset(1)  # the fixture's dataset of member 0 (cap 3_000_000)
    copy = data.register_dataset(b"\x71" * 32, b"\x02" * 32, b"\x05" * 32, 100, 2_000_000)
    assert data.source_of(copy) == first.source_id
    assert data.get_source(first.source_id).cap == 2_000_000  # the most restrictive declaration
    call = data.register_call(b"\x72" * 32, b"\x02" * 32, b"\x05" * 32, 50, 4_000_000, disjoint=True)
    event = fed.member(0).client.transact(call).event("DatasetRegistered").args
    assert event["disjoint"] is True and event["sourceId"] != first.source_id
    assert data.get_source(event["sourceId"]).cap == 4_000_000
    # another provider's dataset never shares a member's source
    assert fed.member(1).data.get_dataset(2).source_id not in (first.source_id, event["sourceId"])


def test_key_rotation_is_the_owners(fed):
    with pytest.raises(errors.NotDatasetOwner):
        fed.member(1).data.rotate_key(1, b"\x09" * 32)
    with pytest.raises(errors.InvalidDataset):
        fed.member(0).data.rotate_key(1, b"\x00" * 32)
    receipt = fed.member(0).data.rotate_key(1, b"\x09" * 32)
    assert receipt.event("DatasetKeyRotated").args["swarmRef"] == "0x" + "09" * 32
    assert fed.member(0).data.get_dataset(1).swarm_ref == b"\x09" * 32


def test_register_dataset_bounds(fed):
    data = fed.member(0).data
    too_many = 10**12 + 1  # DataRegistry.MAX_SAMPLES + 1: more than a 40-bit participant field holds
    with pytest.raises(errors.InvalidDataset) as caught:
        data.register_dataset(b"\x31" * 32, b"\x02" * 32, b"\x03" * 32, too_many, 10)
    assert caught.value.args_ == {"reason": "samples"}
    with pytest.raises(errors.InvalidDataset) as caught:
        data.register_dataset(b"\x31" * 32, b"\x02" * 32, b"\x03" * 32, 5, 100_000_001)  # epsilon > 100
    assert caught.value.args_ == {"reason": "privacyCap"}
    with pytest.raises(errors.InvalidDataset):
        data.register_dataset(b"\x31" * 32, b"\x00" * 32, b"\x03" * 32, 5, 10)  # no swarm reference
    dataset_id = data.register_dataset(b"\x31" * 32, b"\x02" * 32, b"\x03" * 32, 10**12, 100_000_000)
    assert data.get_dataset(dataset_id).samples == 10**12


def test_a_commitment_is_registered_once(fed):
    data = fed.member(0).data
    first = data.register_dataset(b"\x41" * 32, b"\x02" * 32, b"\x03" * 32, 5, 10)
    assert data.dataset_by_commitment(b"\x41" * 32) == first
    assert data.dataset_by_commitment(b"\x42" * 32) == 0
    # the same commitment again, from anyone: refused with the existing id
    with pytest.raises(errors.DuplicateDataset) as caught:
        fed.member(1).data.register_dataset(b"\x41" * 32, b"\x09" * 32, b"\x03" * 32, 5, 3_000_000)
    assert caught.value.args_ == {"commitment": "0x" + "41" * 32, "existingId": first}
    # also against the datasets registered in the fixture
    with pytest.raises(errors.DuplicateDataset) as caught:
        data.register_dataset(bytes([3]) * 32, b"\x09" * 32, b"\x03" * 32, 5, 10)
    assert caught.value.args_["existingId"] == 3


def test_public_holdout_declaration_is_on_chain(fed):
    data = fed.member(0).data
    holdout = b"\x5a" * 32
    call = data.register_call(b"\x51" * 32, b"\x02" * 32, b"\x03" * 32, 50, 10, holdout)
    receipt = fed.member(0).client.transact(call)
    event = receipt.event("DatasetRegistered").args
    assert event["publicHoldoutHash"] == "0x" + "5a" * 32
    info = data.get_dataset(event["datasetId"])
    assert info.public_holdout_hash == holdout and info.has_public_holdout
    plain = data.get_dataset(1)  # registered without a declaration
    assert plain.public_holdout_hash == b"\x00" * 32 and not plain.has_public_holdout


def test_grant_bounds_the_wrapped_key(fed):
    owner = fed.member(0).data
    with pytest.raises(errors.FieldTooLong) as caught:
        owner.grant(1, fed.address(1), b"\x01" * 513, 1)
    assert caught.value.args_ == {"field": "wrappedKey", "length": 513, "limit": 512}
    with pytest.raises(errors.InvalidDataset):
        owner.grant(1, fed.address(1), b"", 1)
    with pytest.raises(errors.UnknownDataset):
        owner.grant(2**200, fed.address(1), b"k", 1)
    owner.grant(1, fed.address(1), b"\x01" * 512, 1)


def test_spends_are_recorded_only_by_the_wired_federated_learning_contract(fed):
    deployer = fed.member(0)  # deployed the contracts (conftest)
    fl_address = deployer.deployment.address("FederatedLearning")
    assert deployer.data.spender() == fl_address
    with pytest.raises(errors.AlreadyWired):
        deployer.data.wire_spender(deployer.deployment.address("NodeRegistry"))
    with pytest.raises(errors.Unauthorized):
        fed.member(1).data.wire_spender(fed.address(1))
    # the old path: a dataset's owner recording a spend for any job id it likes
    for who in (deployer, fed.member(1), fed.outsider()):
        with pytest.raises(errors.Unauthorized):
            who.client.transact(who.data.encode("recordSpend", 1, 7, 1, who.client.address, 1, 0, 0))
    assert deployer.data.get_source(deployer.data.source_of(1)).spent == 0


def test_registration_release_counts_toward_its_source(fed):
    """A dataset registers a DP count of its records, a release: its epsilon (``initialSpend``)
    counts into the source's spend, at most the source's cap, and DatasetRegistered records it."""
    data, client = fed.member(0).data, fed.member(0).client
    with pytest.raises(errors.InvalidDataset) as caught:  # more than the new source's whole cap
        client.transact(
            data.register_call(
                b"\x81" * 32,
                b"\x02" * 32,
                b"\x05" * 32,
                97,
                4_000_000,
                disjoint=True,
                initial_spend=4_000_001,
            )
        )
    assert caught.value.args_ == {"reason": "initialSpend"}
    assert data.dataset_by_commitment(b"\x81" * 32) == 0  # nothing registered
    call = data.register_call(
        b"\x81" * 32, b"\x02" * 32, b"\x05" * 32, 97, 4_000_000, disjoint=True, initial_spend=250_000
    )
    event = client.transact(call).event("DatasetRegistered").args
    assert event["initialSpend"] == 250_000
    source = data.get_source(data.source_of(event["datasetId"]))
    assert (source.cap, source.spent) == (4_000_000, 250_000)
    # the whole cap at once is within it (as a spend of exactly what is left is)
    whole = data.register_dataset(
        b"\x82" * 32, b"\x02" * 32, b"\x05" * 32, 50, 1_000_000, disjoint=True, initial_spend=1_000_000
    )
    assert data.get_source(data.source_of(whole)).spent == 1_000_000
    # without a release (0) nothing is counted
    plain = data.register_dataset(b"\x83" * 32, b"\x02" * 32, b"\x05" * 32, 50, 1_000_000, disjoint=True)
    assert data.get_source(data.source_of(plain)).spent == 0


def test_a_shared_source_accumulates_registration_releases(fed):
    """Each dataset joining a provider's shared source adds its release to what the source spent,
    checked against the source's cap after the new dataset's cap applies."""
    data = fed.member(0).data
    source_id = data.source_of(1)  # the fixture's dataset of member 0: cap 3_000_000, nothing spent
    first = data.register_dataset(
        b"\x91" * 32, b"\x02" * 32, b"\x05" * 32, 90, 3_000_000, initial_spend=1_000_000
    )
    assert data.source_of(first) == source_id and data.get_source(source_id).spent == 1_000_000
    # 1_000_000 + 1_500_000 fits the source's cap of 3_000_000, not this dataset's 2_000_000
    with pytest.raises(errors.InvalidDataset) as caught:
        data.register_dataset(
            b"\x92" * 32, b"\x02" * 32, b"\x05" * 32, 90, 2_000_000, initial_spend=1_500_000
        )
    assert caught.value.args_ == {"reason": "initialSpend"}
    assert data.get_source(source_id).cap == 3_000_000  # the refused registration changed nothing
    data.register_dataset(b"\x92" * 32, b"\x02" * 32, b"\x05" * 32, 90, 2_000_000, initial_spend=1_000_000)
    source = data.get_source(source_id)
    assert (source.cap, source.spent) == (2_000_000, 2_000_000)
    for amount in (1, 2**64 - 1):  # past the cap, or past what any counter holds: refused alike
        with pytest.raises(errors.InvalidDataset):
            data.register_dataset(
                b"\x93" * 32, b"\x02" * 32, b"\x05" * 32, 90, 3_000_000, initial_spend=amount
            )
    assert data.get_source(source_id).spent == 2_000_000
    # another provider's source is its own
    other = fed.member(1).data
    assert other.get_source(other.source_of(2)).spent == 0


@pytest.mark.django_db
def test_the_mirror_counts_registration_releases(fed):
    """The indexer adds DatasetRegistered's initialSpend to the source's spend, once."""
    from backend.ledger import models
    from backend.ledger.indexer import EventIndexer

    data = fed.member(0).data
    source_id = data.source_of(1)
    data.register_dataset(b"\xa1" * 32, b"\x02" * 32, b"\x05" * 32, 90, 3_000_000, initial_spend=700_000)
    data.register_dataset(b"\xa2" * 32, b"\x02" * 32, b"\x05" * 32, 90, 3_000_000, initial_spend=300_000)
    own = data.register_dataset(
        b"\xa3" * 32, b"\x02" * 32, b"\x05" * 32, 90, 3_000_000, disjoint=True, initial_spend=5
    )
    indexer = EventIndexer(fed.member(0).client, fed.member(0).deployment)
    indexer.sync()
    assert (
        models.BudgetSource.objects.get(source_id=source_id).spent
        == 1_000_000
        == data.get_source(source_id).spent
    )
    shown = set(
        models.Dataset.objects.filter(source__source_id=source_id).values_list("privacy_spent", flat=True)
    )
    assert shown == {1_000_000}  # every dataset of the source shows the source's spend
    assert models.Dataset.objects.get(dataset_id=own).privacy_spent == 5
    models.IndexerCursor.objects.all().delete()  # a replay adds nothing
    assert indexer.sync().new_events == 0
    assert models.BudgetSource.objects.get(source_id=source_id).spent == 1_000_000
