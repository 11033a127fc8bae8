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
