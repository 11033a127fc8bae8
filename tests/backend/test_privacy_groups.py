"""One budget per source: a provider's datasets share one unless declared disjoint; the same
records refused twice on this node (keyed content hash), declarations checked by keyed record
hashes; the chain sees keyed commitments only.

Uploads go through the API into a real database and chunk store; the chain tests use the
in-process EVM with the deployed contracts.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from dataset_files import form, npz_file

from backend.datasets import budget, commitment, overlap
from backend.datasets.formats import CanonicalDataset
from backend.datasets.models import Dataset, PrivacyRelease, RecordHash
from fl_node.privacy import ReleasePlan

pytestmark = pytest.mark.django_db

TRAIN = ReleasePlan("dp_sgd", noise_multiplier=2.0, sample_rate=0.05, steps=60)


def _records(seed: int, samples: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((samples, 6)).astype(np.float32), rng.integers(0, 3, samples).astype(np.int64)


def _upload(client, x, y, *, name: str = "set", **extra):
    return client.post("/api/datasets", form(npz_file(x=x, y=y), "npz", name=name, **extra))


def test_a_reordered_upload_is_refused_by_the_keyed_content_hash(provider):
    x, y = _records(1)
    first = _upload(provider, x, y)
    assert first.status_code == 201, first.content
    order = np.random.default_rng(9).permutation(len(y))
    again = _upload(provider, x[order], y[order], name="shuffled")
    assert again.status_code == 400
    assert f"already registered as dataset {first.json()['id']}" in again.json()["detail"]
    assert Dataset.objects.count() == 1
    # What the node keeps and what it shows are keyed: neither is the records' plain hash.
    shuffled = CanonicalDataset(x[order], y[order], ("0", "1", "2"))
    stored = Dataset.objects.get()
    assert stored.content_hash == overlap.local_content_hash(shuffled.record_digests)
    assert shuffled.content_hash not in (stored.content_hash, first.json()["content_hash"])
    assert first.json()["content_hash"] == first.json()["commitment"] == stored.commitment


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


def test_a_providers_datasets_share_one_budget_unless_declared_disjoint(provider):
    """Budgets per source: a rescaled copy shares no record hash, so sharing is the default."""
    x, y = _records(3)
    a = _upload(provider, x, y).json()
    rescaled = _upload(provider, x * np.float32(0.5), y, name="rescaled").json()
    assert a["budget"]["budget_group"] == [a["id"]]
    assert rescaled["budget"]["budget_group"] == [a["id"], rescaled["id"]]
    assert not a["disjoint"] and not rescaled["disjoint"]
    budget.reserve_release(Dataset.objects.get(pk=a["id"]), 1, 1, TRAIN)
    assert provider.get(f"/api/datasets/{rescaled['id']}").json()["budget"]["epsilon_reserved"] > 0

    own = _upload(provider, *_records(4), name="other", disjoint="true").json()
    assert own["disjoint"] and own["budget"]["budget_group"] == [own["id"]]
    assert own["budget"]["epsilon_reserved"] == 0.0


def test_a_declaration_the_records_contradict_is_refused_before_registration(provider):
    xa, ya = _records(5)
    xb, yb = _records(6)
    shared = _upload(provider, xa, ya).json()
    own = _upload(provider, xb, yb, name="b", disjoint="true").json()
    # Declared disjoint, yet it holds records of the shared dataset.
    copy = _upload(provider, xa[:10], ya[:10], name="part of a", disjoint="true")
    assert copy.status_code == 400, copy.content
    assert "declared disjoint but shares records" in copy.json()["detail"]
    assert copy.json()["errors"]["disjoint"]
    # Records of a disjoint dataset in a shared one: their spends would miss its source.
    bridge = _upload(
        provider, np.concatenate([xa[:3], xb[:3]]), np.concatenate([ya[:3], yb[:3]]), name="bridge"
    )
    assert bridge.status_code == 400, bridge.content
    assert f"{own['id']}" in bridge.json()["detail"]
    assert sorted(Dataset.objects.values_list("pk", flat=True)) == [shared["id"], own["id"]]
    # An overlap with the shared source's datasets alone is fine: the same budget already.
    part = _upload(provider, xa[:10], ya[:10], name="part of a")
    assert part.status_code == 201, part.content
    assert part.json()["budget"]["budget_group"] == [shared["id"], part.json()["id"]]


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


def test_records_another_node_registered_cannot_be_recognised_from_the_chain(provider, on_chain):
    # The records were registered from elsewhere (this node keeps no row of them): each upload
    # draws a fresh secret, so the chain sees an unrelated commitment and cannot refuse it. That
    # is the price of a commitment that is no membership oracle (docs/PRIVACY.md).
    x, y = _records(11)
    first = _upload(provider, x, y)
    assert first.status_code == 201, first.content
    PrivacyRelease.objects.all().delete()  # the audit record protects its datasets
    Dataset.objects.all().delete()
    RecordHash.objects.all().delete()
    order = np.arange(len(y))[::-1]
    again = _upload(provider, x[order], y[order], name="reversed")
    assert again.status_code == 201, again.content
    assert again.json()["commitment"] != first.json()["commitment"]
    assert again.json()["onchain_id"] != first.json()["onchain_id"]


def test_a_public_holdout_is_declared_on_chain_as_a_keyed_commitment(provider, on_chain):
    x, y = _records(12)
    declared = _upload(provider, x, y, public_holdout="true")
    assert declared.status_code == 201, declared.content
    body = declared.json()
    assert body["public_holdout"] is True
    on_record = on_chain["ledger"].data.get_dataset(int(body["onchain_id"]))
    stored = Dataset.objects.get(pk=body["id"])
    digests = CanonicalDataset(x, y, ("0", "1", "2")).record_digests
    assert bytes(on_record.public_holdout_hash).hex() == commitment.holdout_commitment(stored.secret, digests)
    # Not derived from the records alone (the earlier declaration hashed the plain content hash).
    plain = CanonicalDataset(x, y, ("0", "1", "2")).content_hash
    assert (
        bytes(on_record.public_holdout_hash)
        != hashlib.sha256(b"defl-public-holdout-v1\n" + bytes.fromhex(plain)).digest()
    )

    private = _upload(provider, *_records(13), name="private").json()
    assert private["public_holdout"] is False
    assert not on_chain["ledger"].data.get_dataset(int(private["onchain_id"])).has_public_holdout


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
