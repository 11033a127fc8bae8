"""The same records get one budget: order-insensitive content hashes, keyed record hashes, groups.

Uploads go through the API into a real database and chunk store; the chain tests use the
in-process EVM with the deployed contracts.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from dataset_files import form, npz_file

from backend.datasets import budget, overlap
from backend.datasets.formats import CanonicalDataset
from backend.datasets.models import Dataset, RecordHash
from backend.ledger import models as mirror
from fl_node.privacy import ReleasePlan

pytestmark = pytest.mark.django_db

TRAIN = ReleasePlan("dp_sgd", noise_multiplier=1.1, sample_rate=0.05, steps=60)


def _records(seed: int, samples: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((samples, 6)).astype(np.float32), rng.integers(0, 3, samples).astype(np.int64)


def _upload(client, x, y, *, name: str = "set", **extra):
    return client.post("/api/datasets", form(npz_file(x=x, y=y), "npz", name=name, **extra))


def test_a_reordered_upload_has_the_same_content_hash_and_is_refused(provider):
    x, y = _records(1)
    first = _upload(provider, x, y)
    assert first.status_code == 201, first.content
    order = np.random.default_rng(9).permutation(len(y))
    again = _upload(provider, x[order], y[order], name="shuffled")
    assert again.status_code == 400
    assert f"already registered as dataset {first.json()['id']}" in again.json()["detail"]
    assert Dataset.objects.count() == 1
    # The content hash does not depend on the order, and is not the hash of the stored blob.
    shuffled = CanonicalDataset(x[order], y[order], ("0", "1", "2"))
    assert shuffled.content_hash == first.json()["content_hash"]
    assert shuffled.blob_hash != shuffled.content_hash


def test_one_row_changed_joins_the_budget_group_and_shares_its_history(provider):
    x, y = _records(2)
    first = _upload(provider, x, y, epsilon_cap=8.0).json()
    x2 = x.copy()
    x2[0, 0] += 1.0  # a new content hash, but 19 of 20 records are the same people
    second = _upload(provider, x2, y, name="one-row-changed", epsilon_cap=5.0)
    assert second.status_code == 201, second.content
    second = second.json()
    assert second["content_hash"] != first["content_hash"]
    assert second["budget"]["budget_group"] == [first["id"], second["id"]]

    a, b = Dataset.objects.get(pk=first["id"]), Dataset.objects.get(pk=second["id"])
    charge = budget.reserve_release(a, 1, 1, TRAIN)
    budget.mark_released(a, 1, 1, "dp_sgd")
    # The spend on one member is the other's too, and the group's cap is the smaller one.
    shown = provider.get(f"/api/datasets/{b.pk}").json()["budget"]
    assert shown["epsilon_spent"] == pytest.approx(charge.epsilon)
    assert shown["epsilon_cap"] == 5.0
    assert shown["budget_group"] == [a.pk, b.pk]
    assert provider.get(f"/api/datasets/{a.pk}").json()["budget"]["epsilon_cap"] == 5.0
    second_charge = budget.reserve_release(b, 2, 1, TRAIN)
    assert second_charge.epsilon > charge.epsilon  # composed with a's release, not a fresh budget


def test_disjoint_datasets_keep_separate_budgets(provider):
    a = _upload(provider, *_records(3)).json()
    b = _upload(provider, *_records(4), name="other").json()
    assert a["budget"]["budget_group"] == [a["id"]]
    assert b["budget"]["budget_group"] == [b["id"]]
    budget.reserve_release(Dataset.objects.get(pk=a["id"]), 1, 1, TRAIN)
    assert provider.get(f"/api/datasets/{b['id']}").json()["budget"]["epsilon_reserved"] == 0.0


def test_an_upload_overlapping_two_groups_merges_them(provider):
    xa, ya = _records(5)
    xb, yb = _records(6)
    a = _upload(provider, xa, ya).json()
    b = _upload(provider, xb, yb, name="b").json()
    budget.reserve_release(Dataset.objects.get(pk=b["id"]), 1, 1, TRAIN)
    bridge = _upload(
        provider, np.concatenate([xa[:3], xb[:3]]), np.concatenate([ya[:3], yb[:3]]), name="bridge"
    )
    assert bridge.status_code == 201, bridge.content
    members = [a["id"], b["id"], bridge.json()["id"]]
    for pk in members:
        shown = provider.get(f"/api/datasets/{pk}").json()["budget"]
        assert shown["budget_group"] == members
        assert shown["epsilon_reserved"] > 0  # b's reservation now weighs on all three


def test_record_hashes_are_keyed_with_the_node_secret(provider, settings):
    x, y = _records(7)
    dataset = Dataset.objects.get(pk=_upload(provider, x, y).json()["id"])
    stored = set(RecordHash.objects.filter(dataset=dataset).values_list("digest", flat=True))
    plain = CanonicalDataset(x, y, ("0", "1", "2")).record_digests
    assert len(stored) == len(set(plain)) == 20
    # Not a plain hash of a record: without the node's key a guess cannot be tested.
    assert not stored & {digest.hex()[: overlap.DIGEST_HEX] for digest in plain}
    assert not stored & {hashlib.sha256(digest).hexdigest()[: overlap.DIGEST_HEX] for digest in plain}
    settings.SECRET_KEY = "another node's secret"
    assert set(overlap.keyed_digests(plain)).isdisjoint(stored)


@pytest.mark.parametrize(
    ("samples", "delta", "status"), [(1000, 1e-4, 201), (1001, 1e-4, 400), (20, 5e-3, 201)]
)
def test_delta_must_be_at_most_one_over_ten_n(provider, samples, delta, status):
    x, y = _records(8, samples=samples)
    response = _upload(provider, x, y, delta=delta)
    assert response.status_code == status, response.content
    if status == 400:
        assert "1/(10·n)" in response.json()["detail"]
        assert response.json()["errors"]["delta"]
        assert not Dataset.objects.exists()


def test_records_the_mirror_knows_on_chain_are_refused_before_anything_is_stored(provider):
    x, y = _records(10)
    content_hash = CanonicalDataset(x, y, ("0", "1", "2")).content_hash
    mirror.Dataset.objects.create(
        dataset_id=41,
        owner="0x" + "11" * 20,
        content_hash="0x" + content_hash,
        swarm_ref="0x" + "22" * 32,
        schema_hash="0x" + "33" * 32,
        samples=20,
        privacy_cap=1_000_000,
        registered_block=1,
    )
    response = _upload(provider, x, y)
    assert response.status_code == 400
    assert "already registered as dataset 41 on chain" in response.json()["detail"]
    assert not Dataset.objects.exists()


def test_the_chain_refusing_the_same_records_is_a_400(provider, on_chain):
    # The records were registered on chain from elsewhere (this node keeps no row of them, and
    # the mirror has not indexed them yet): the chain's DuplicateDataset surfaces as a 400.
    x, y = _records(11)
    first = _upload(provider, x, y)
    assert first.status_code == 201, first.content
    onchain_id = first.json()["onchain_id"]
    Dataset.objects.all().delete()
    RecordHash.objects.all().delete()
    order = np.arange(len(y))[::-1]
    response = _upload(provider, x[order], y[order], name="reversed")
    assert response.status_code == 400, response.content
    assert f"already registered as dataset {onchain_id} on chain" in response.json()["detail"]
    assert not Dataset.objects.exists()


def test_a_public_holdout_is_declared_on_chain_bound_to_the_records(provider, on_chain):
    x, y = _records(12)
    declared = _upload(provider, x, y, public_holdout="true")
    assert declared.status_code == 201, declared.content
    body = declared.json()
    assert body["public_holdout"] is True
    on_record = on_chain["ledger"].data.get_dataset(int(body["onchain_id"]))
    expected = hashlib.sha256(b"defl-public-holdout-v1\n" + bytes.fromhex(body["content_hash"])).digest()
    assert bytes(on_record.public_holdout_hash) == expected

    plain = _upload(provider, *_records(13), name="private").json()
    assert plain["public_holdout"] is False
    assert not on_chain["ledger"].data.get_dataset(int(plain["onchain_id"])).has_public_holdout


def test_a_dataset_past_the_record_limit_is_refused(provider, monkeypatch):
    from backend.datasets import services

    monkeypatch.setattr(services, "MAX_RECORDS", 19)
    response = _upload(provider, *_records(14))  # 20 records
    assert response.status_code == 400 and "at most 19" in response.json()["detail"]
    assert not Dataset.objects.exists() and not RecordHash.objects.exists()


@pytest.mark.parametrize("cap", ["0", "100.5", "nan", "inf"])
def test_a_cap_the_chain_would_refuse_is_a_400_before_anything_is_stored(provider, cap):
    response = _upload(provider, *_records(15), epsilon_cap=cap)
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["epsilon_cap"]
    assert not Dataset.objects.exists()
