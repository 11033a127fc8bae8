"""GET /api/node, /api/peers, /api/events, and the ``node`` management command."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from eth_account import Account

from backend.identity.roles import Role, role_of

pytestmark = pytest.mark.django_db


def test_node_without_ledger_degrades_with_clear_fields(viewer):
    body = viewer.get("/api/node").json()
    assert body["address"] == Account.from_key("0x" + "4c" * 32).address
    assert body["overlay"].startswith("0x") and len(body["overlay"]) == 66
    assert body["chain"]["available"] is False
    assert "ledger is not available" in body["chain"]["error"]
    assert body["storage"] == {"available": True, "chunks": 0, "bytes": 0, "pinned_chunks": 0, "error": None}
    assert body["workers"]["eager"] is True
    assert body["device"] in ("cpu", "cuda")


def test_node_without_a_key_says_so(viewer, settings):
    from backend.identity.key import node_account

    settings.DEFL_NODE_KEY = ""
    settings.DEFL_KEYSTORE_PATH = "/nonexistent/keystore.json"
    node_account.cache_clear()
    body = viewer.get("/api/node").json()
    assert body["address"] is None
    assert "node init" in body["identity_error"]


def test_node_and_peers_on_chain(viewer, on_chain):
    body = viewer.get("/api/node").json()
    assert body["chain"]["available"] is True
    assert body["chain"]["block"] > 0
    assert set(body["chain"]["contracts"]) >= {"NodeRegistry", "DataRegistry", "FederatedLearning"}
    peers = viewer.get("/api/peers").json()
    assert [p["address"] for p in peers] == [on_chain["grantee"].address]
    assert peers[0]["endpoint"] == "http://127.0.0.1:8001"


def test_events_come_from_the_indexer_newest_first_and_limit_is_validated(viewer):
    from backend.ledger.models import ChainEvent

    for block in (5, 7):
        ChainEvent.objects.create(
            contract="DataRegistry", address="0x" + "11" * 20, name="DatasetRegistered", block_number=block,
            tx_hash="0x" + f"{block:02x}" * 32, log_index=0, args={"datasetId": block},
        )  # fmt: skip
    events = viewer.get("/api/events?limit=1").json()
    assert [(e["name"], e["block"], e["args"]) for e in events] == [
        ("DatasetRegistered", 7, {"datasetId": 7})
    ]
    response = viewer.get("/api/events?limit=0")
    assert response.status_code == 400
    assert "limit" in response.json()["errors"]


def test_adduser_creates_a_user_with_role_and_token(monkeypatch, django_user_model):
    monkeypatch.setenv("NEW_PASSWORD", "a-long-password")
    out = io.StringIO()
    call_command(
        "node", "adduser", "carol", "--role", "provider", "--password-env", "NEW_PASSWORD", stdout=out
    )
    assert "created carol with role provider" in out.getvalue()
    user = django_user_model.objects.get(username="carol")
    assert role_of(user) == Role.PROVIDER and user.check_password("a-long-password")
    call_command("node", "adduser", "carol", "--role", "viewer", stdout=io.StringIO())
    assert role_of(django_user_model.objects.get(username="carol")) == Role.VIEWER


def test_adduser_with_an_unset_password_variable_fails():
    with pytest.raises(CommandError, match="UNSET_VAR is not set"):
        call_command("node", "adduser", "dave", "--role", "viewer", "--password-env", "UNSET_VAR")


def test_init_creates_a_keystore_and_skips_registration_without_ledger(settings, tmp_path):
    settings.DEFL_NODE_KEY = ""
    settings.DEFL_KEYSTORE_PATH = str(tmp_path / "keystore.json")
    settings.DEFL_KEYSTORE_PASSWORD = "pw"
    out = io.StringIO()
    call_command("node", "init", stdout=out)
    assert "created in encrypted keystore" in out.getvalue()
    assert "chain registration: skipped" in out.getvalue()
    assert "ciphertext" in json.loads((tmp_path / "keystore.json").read_text())["crypto"]
    # Run again: the existing keystore is used, never replaced.
    out = io.StringIO()
    call_command("node", "init", stdout=out)
    assert "existing keystore" in out.getvalue()


def test_init_imports_a_key_and_registers_on_chain(settings, tmp_path, monkeypatch, empty_chain):
    key = "0x" + "4c" * 32  # the deployer of empty_chain, so the registry admits it at once
    settings.DEFL_NODE_KEY = ""
    settings.DEFL_KEYSTORE_PATH = str(tmp_path / "keystore.json")
    settings.DEFL_KEYSTORE_PASSWORD = "pw"
    monkeypatch.setenv("IMPORTED_KEY", key)
    out = io.StringIO()
    call_command("node", "init", "--import-key-env", "IMPORTED_KEY", stdout=out)
    address = Account.from_key(key).address
    assert f"node address: {address}" in out.getvalue()
    assert "chain registration: registered (status on chain: member)" in out.getvalue()
    assert empty_chain.nodes.is_member(address)
    out = io.StringIO()
    call_command("node", "init", stdout=out)
    assert "already registered" in out.getvalue()


def test_init_refuses_a_bad_imported_key(settings, tmp_path, monkeypatch):
    settings.DEFL_NODE_KEY = ""
    settings.DEFL_KEYSTORE_PATH = str(tmp_path / "keystore.json")
    settings.DEFL_KEYSTORE_PASSWORD = "pw"
    monkeypatch.setenv("IMPORTED_KEY", "0x1234")
    with pytest.raises(CommandError, match="valid secp256k1"):
        call_command("node", "init", "--import-key-env", "IMPORTED_KEY", stdout=io.StringIO())
    assert not (tmp_path / "keystore.json").exists()


def test_status_prints_identity_chain_storage_and_peers(on_chain):
    out = io.StringIO()
    call_command("node", "status", stdout=out)
    text = out.getvalue()
    assert "address:   0x" in text
    assert "chain:     id" in text and "block" in text
    assert "storage:   0 chunks" in text
    assert "peers:     1" in text and on_chain["grantee"].address in text
