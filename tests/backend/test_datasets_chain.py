"""Datasets on chain: registration, grant / revoke round trip, the grantee opening its grant."""

from __future__ import annotations

import numpy as np
import pytest
from dataset_files import form, good_npz

from backend.datasets import services
from backend.datasets.keys import unwrap_key
from backend.datasets.models import Dataset

pytestmark = pytest.mark.django_db


def _upload(client, seed: int = 0) -> dict:
    response = client.post("/api/datasets", form(good_npz(seed=seed), "npz"))
    assert response.status_code == 201, response.content
    return response.json()


def test_upload_registers_the_dataset_on_chain(provider, on_chain):
    body = _upload(provider, seed=10)
    assert body["status"] == "registered"
    assert body["tx_hash"].startswith("0x")
    record = on_chain["ledger"].data.get_dataset(int(body["onchain_id"]))
    assert bytes(record.commitment).hex() == body["commitment"] == body["content_hash"]
    # Only the root address is public; the key stays in the node's database.
    assert bytes(record.swarm_ref).hex() == Dataset.objects.get().encrypted_reference[:64]


def test_grant_and_revoke_round_trip(provider, viewer, on_chain):
    dataset = _upload(provider, seed=11)
    grantee = on_chain["grantee"]
    data = on_chain["ledger"].data
    url = f"/api/datasets/{dataset['id']}/grants"

    assert viewer.post(url, {"node": grantee.address}, format="json").status_code == 403
    response = provider.post(url, {"node": grantee.address}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["node"] == grantee.address
    assert data.is_granted(int(dataset["onchain_id"]), grantee.address)

    # The grantee opens the wrapped key from the chain event with its own key, and nobody else can.
    grant = Dataset.objects.get().grants.get()
    wrapped = bytes.fromhex(grant.wrapped_key)
    assert unwrap_key(grantee.key, wrapped) == Dataset.objects.get().encrypted_reference
    with pytest.raises(ValueError):
        unwrap_key(bytes.fromhex("4c" * 32), wrapped)

    assert provider.post(url, {"node": grantee.address}, format="json").status_code == 409
    assert [g["node"] for g in viewer.get(url).json()] == [grantee.address]

    response = provider.delete(f"{url}/{grantee.address}")
    assert response.status_code == 200, response.content
    assert response.json()["revoked"] and response.json()["revoke_tx_hash"].startswith("0x")
    assert not data.is_granted(int(dataset["onchain_id"]), grantee.address)
    assert provider.delete(f"{url}/{grantee.address}").status_code == 404


def test_grant_to_unknown_node_or_bad_address(provider, on_chain):
    dataset = _upload(provider, seed=12)
    url = f"/api/datasets/{dataset['id']}/grants"
    response = provider.post(url, {"node": "0x" + "12" * 20}, format="json")
    assert response.status_code == 404
    assert "not a node registered" in response.json()["detail"]
    response = provider.post(url, {"node": "not-an-address"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["node"]


def test_providers_grant_only_their_own_datasets(operator, provider, on_chain):
    dataset = _upload(operator, seed=13)
    response = provider.post(f"/api/datasets/{dataset['id']}/grants", {"node": on_chain["grantee"].address})
    assert response.status_code == 403


def test_grantee_loads_a_granted_dataset(provider, on_chain, settings):
    """load_dataset_arrays on the grantee's side: the key is unwrapped with the grantee's node key."""
    from types import SimpleNamespace

    from backend.identity.key import node_account

    dataset = _upload(provider, seed=14)
    grantee = on_chain["grantee"]
    provider.post(f"/api/datasets/{dataset['id']}/grants", {"node": grantee.address}, format="json")
    grant = Dataset.objects.get().grants.get()

    # This process plays the grantee: its node key is the grantee's (the chunks are local anyway).
    settings.DEFL_NODE_KEY = grantee.key.hex()
    node_account.cache_clear()
    granted = SimpleNamespace(
        wrapped_key=bytes.fromhex(grant.wrapped_key), content_hash=dataset["content_hash"]
    )
    x, y = services.load_dataset_arrays(granted)
    assert x.shape == (12, 1, 4, 4) and x.dtype == np.float32
    assert y.dtype == np.int64


def test_ledger_revert_becomes_409_and_undoes_the_upload(provider, on_chain, monkeypatch):
    from backend.ledger.errors import ContractRevert

    def reverted(**_kwargs):
        raise ContractRevert("NotMember(0x…)")

    monkeypatch.setattr("backend.datasets.chain.register_dataset", reverted)
    response = provider.post("/api/datasets", form(good_npz(seed=15), "npz"))
    assert response.status_code == 409
    assert "NotMember" in response.json()["detail"]
    assert Dataset.objects.count() == 0


def _pins(reference: str) -> int:
    from backend.swarm import factory

    return factory.node_swarm().store.pins(bytes.fromhex(reference[:64]))


def _grant_both(provider, dataset: dict, grantees) -> str:
    url = f"/api/datasets/{dataset['id']}/grants"
    for grantee in grantees:
        response = provider.post(url, {"node": grantee.address}, format="json")
        assert response.status_code == 201, response.content
    return url


def test_a_revocation_rotates_the_data_key(provider, on_three):
    """Revoking one of two grantees re-encrypts the dataset under a fresh key: the chain records
    the new root, the remaining grantee's grant is wrapped again for the new reference with its
    cap unchanged and opens the dataset, and the revoked grantee's key opens only the retired
    reference, which this node no longer pins."""
    kept, revoked = on_three["grantees"]
    data = on_three["ledger"].data
    dataset = _upload(provider, seed=16)
    onchain = int(dataset["onchain_id"])
    url = _grant_both(provider, dataset, (kept, revoked))
    row = Dataset.objects.get()
    old_reference = row.encrypted_reference
    revoked_key = bytes.fromhex(row.grants.get(grantee=revoked.address).wrapped_key)
    cap_before = data.get_grant(onchain, kept.address).cap

    response = provider.delete(f"{url}/{revoked.address}")
    assert response.status_code == 200, response.content

    row.refresh_from_db()
    new_reference = row.encrypted_reference
    assert new_reference != old_reference and row.key_rotation_requested is None and not row.retired_reference
    assert bytes(data.get_dataset(onchain).swarm_ref).hex() == new_reference[:64]
    kept_grant = data.get_grant(onchain, kept.address)
    assert kept_grant.active and kept_grant.cap == cap_before
    assert not data.get_grant(onchain, revoked.address).active
    assert (
        unwrap_key(kept.key, bytes.fromhex(row.grants.get(grantee=kept.address).wrapped_key)) == new_reference
    )
    assert unwrap_key(revoked.key, revoked_key) == old_reference
    assert _pins(old_reference) == 0 and _pins(new_reference) > 0
    x, _ = services.load_dataset_arrays(row)  # the owner reads the re-encrypted blob, checked
    assert x.shape == (12, 1, 4, 4)


@pytest.mark.parametrize("failure", ["revert", "anything"])
def test_a_rotation_cut_short_resumes_where_it_stopped(provider, on_three, monkeypatch, failure):
    """rotateKey fails once (the chain refuses it, or anything else goes wrong): the revocation
    stands (200), the rotation stays due with the new blob stored and the old one still pinned
    (the remaining grantee reads either); the agent's next try finishes it, storing nothing again."""
    from backend.datasets import chain
    from backend.ledger.errors import ContractRevert

    kept, revoked = on_three["grantees"]
    dataset = _upload(provider, seed=17 if failure == "revert" else 18)
    url = _grant_both(provider, dataset, (kept, revoked))
    old_reference = Dataset.objects.get().encrypted_reference
    rotate = chain.rotate_key

    def refused(*_args):
        raise ContractRevert("NotOwner(…)") if failure == "revert" else RuntimeError("a bug")

    monkeypatch.setattr(chain, "rotate_key", refused)
    assert provider.delete(f"{url}/{revoked.address}").status_code == 200
    row = Dataset.objects.get()
    assert row.key_rotation_requested is not None and row.key_rotation_claimed is None
    assert row.retired_reference == old_reference
    stored = row.encrypted_reference
    assert stored != old_reference and _pins(old_reference) > 0

    monkeypatch.setattr(chain, "rotate_key", rotate)
    assert services.rotate_due_keys() == 1
    row.refresh_from_db()
    assert (
        row.key_rotation_requested is None and not row.retired_reference and row.encrypted_reference == stored
    )
    assert _pins(old_reference) == 0
    assert (
        bytes(on_three["ledger"].data.get_dataset(int(dataset["onchain_id"])).swarm_ref).hex() == stored[:64]
    )
    assert services.rotate_due_keys() == 0


def test_one_process_rotates_a_dataset_at_a_time(provider, on_three):
    """A rotation another process claimed (the revoking request, while the agent ticks) is left to
    it; a claim older than the lease belongs to a process that stopped and is taken over."""
    from datetime import timedelta

    from django.utils import timezone

    kept, revoked = on_three["grantees"]
    dataset = _upload(provider, seed=19)
    _grant_both(provider, dataset, (kept, revoked))
    row = Dataset.objects.get()
    old_reference = row.encrypted_reference
    now = timezone.now()
    Dataset.objects.filter(pk=row.pk).update(key_rotation_requested=now, key_rotation_claimed=now)
    assert services.rotate_due_keys() == 0
    row.refresh_from_db()
    assert row.encrypted_reference == old_reference and not row.retired_reference  # nothing stored
    lapsed = now - timedelta(seconds=services.ROTATION_LEASE_S + 1)
    Dataset.objects.filter(pk=row.pk).update(key_rotation_claimed=lapsed)
    assert services.rotate_due_keys() == 1
    row.refresh_from_db()
    assert row.encrypted_reference != old_reference
    assert row.key_rotation_requested is None and row.key_rotation_claimed is None


def test_a_revocation_during_a_rotation_leaves_another_one_due(provider, on_three, monkeypatch):
    """A grantee revoked while a rotation runs may have been wrapped the new key already: its
    revocation asks for another rotation, which the first one's end does not clear."""
    from django.utils import timezone

    from backend.datasets import chain

    kept, revoked = on_three["grantees"]
    dataset = _upload(provider, seed=20)
    url = _grant_both(provider, dataset, (kept, revoked))
    rotate = chain.rotate_key

    def revoked_meanwhile(*args):
        Dataset.objects.update(key_rotation_requested=timezone.now())  # the other revocation's mark
        return rotate(*args)

    monkeypatch.setattr(chain, "rotate_key", revoked_meanwhile)
    assert provider.delete(f"{url}/{revoked.address}").status_code == 200
    row = Dataset.objects.get()
    first = row.encrypted_reference
    assert row.key_rotation_requested is not None and not row.retired_reference
    monkeypatch.setattr(chain, "rotate_key", rotate)
    assert services.rotate_due_keys() == 1
    row.refresh_from_db()
    assert row.encrypted_reference != first and row.key_rotation_requested is None
    assert _pins(first) == 0
