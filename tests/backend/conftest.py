"""Fixtures of the backend API tests: a node key, a fresh chunk store, users of each role."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.nodes.accounts import api_token, create_or_update_user

# A fixed, test-only key (never funded anywhere): the node's identity in these tests.
TEST_NODE_KEY = "0x" + "4c" * 32


def _clear_node_caches() -> None:
    from backend.identity.key import node_account
    from backend.serving.services import model_cache

    node_account.cache_clear()
    model_cache.clear()
    try:
        from backend.swarm import factory
    except ImportError:
        return
    for cached in (factory.node_swarm, factory.local_store, factory.peer_directory):
        cached.cache_clear()


@pytest.fixture(autouse=True)
def no_ledger_by_default(monkeypatch):
    """Tests run without a chain unless they ask for one (on_chain, empty_chain), so that the
    factory's in-process chain is never deployed behind a test's back."""
    from backend.ledger import access as ledger_access

    monkeypatch.setattr(ledger_access, "node_ledger", lambda: None)


@pytest.fixture(autouse=True)
def node_settings(settings, tmp_path):
    """Every test gets this node's key, its own empty chunk store and upload temp dir."""
    settings.DEFL_NODE_KEY = TEST_NODE_KEY
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    settings.DEFL_PEERS = []
    settings.DEFL_REPLICATION = 1
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "uploads")
    (tmp_path / "uploads").mkdir()
    _clear_node_caches()
    yield settings
    _clear_node_caches()


class NodeClient(APIClient):
    """The API's test client: JSON bodies (settings TEST_REQUEST_DEFAULT_FORMAT), multipart when a
    body carries a file, as a browser's upload form sends it."""

    def _encode_data(self, data, format=None, content_type=None):
        if format is None and content_type is None and isinstance(data, dict):
            if any(hasattr(value, "read") for value in data.values()):
                format = "multipart"
        return super()._encode_data(data, format, content_type)


@pytest.fixture
def make_client(db):
    def make(role: Role | None) -> APIClient:
        client = NodeClient()
        if role is not None:
            user, _ = create_or_update_user(f"{role.value}-user", role, password="correct horse")
            client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
            client.user = user
        return client

    return make


@pytest.fixture
def operator(make_client) -> APIClient:
    return make_client(Role.OPERATOR)


@pytest.fixture
def provider(make_client) -> APIClient:
    return make_client(Role.PROVIDER)


@pytest.fixture
def viewer(make_client) -> APIClient:
    return make_client(Role.VIEWER)


@pytest.fixture
def anonymous() -> APIClient:
    return NodeClient()


# ----------------------------------------------------------------------------- chain


def _deployed_ledger():
    """A fresh in-process chain with the contracts deployed by this node's key."""
    from eth_account import Account

    from backend.ledger.chains import ensure_funds, new_in_process_chain
    from backend.ledger.client import ChainClient
    from backend.ledger.deployment import Ledger, deploy_contracts

    w3 = new_in_process_chain()
    account = Account.from_key(TEST_NODE_KEY)
    ensure_funds(w3, account.address)
    client = ChainClient(w3, account)
    return Ledger(client, deploy_contracts(client, allow_small_committees=True))  # a development deployment


def ledger_for(ledger, account):
    from backend.ledger.chains import ensure_funds
    from backend.ledger.client import ChainClient

    ensure_funds(ledger.client.w3, account.address)
    return ledger.for_account(ChainClient(ledger.client.w3, account))


@pytest.fixture(scope="module")
def consortium():
    """This node and a second node (the grantee of the grant tests), both admitted members."""
    from devnet.consortium import bootstrap_consortium, dev_account

    ledger = _deployed_ledger()
    grantee = dev_account(1, seed="defl-backend-tests")
    other = ledger_for(ledger, grantee)
    bootstrap_consortium([ledger, other], ["http://127.0.0.1:8000", "http://127.0.0.1:8001"])
    return {"ledger": ledger, "grantee": grantee, "grantee_ledger": other}


@pytest.fixture
def on_chain(consortium, monkeypatch):
    """Route this node's ledger access to the consortium's in-process chain."""
    from backend.ledger import access as ledger_access

    monkeypatch.setattr(ledger_access, "node_ledger", lambda: consortium["ledger"])
    return consortium


@pytest.fixture(scope="module")
def three_members():
    """This node and two grantees, all admitted (a revocation among several grantees)."""
    from devnet.consortium import bootstrap_consortium, dev_account

    ledger = _deployed_ledger()
    grantees = [dev_account(i, seed="defl-backend-rotation") for i in (1, 2)]
    others = [ledger_for(ledger, account) for account in grantees]
    bootstrap_consortium([ledger, *others], [f"http://127.0.0.1:{8000 + i}" for i in range(3)])
    return {"ledger": ledger, "grantees": grantees}


@pytest.fixture
def on_three(three_members, monkeypatch):
    """Route this node's ledger access to the three members' in-process chain."""
    from backend.ledger import access as ledger_access

    monkeypatch.setattr(ledger_access, "node_ledger", lambda: three_members["ledger"])
    return three_members


@pytest.fixture
def empty_chain(monkeypatch):
    """Contracts deployed, nobody registered yet (for ``node init``)."""
    from backend.ledger import access as ledger_access

    ledger = _deployed_ledger()
    monkeypatch.setattr(ledger_access, "node_ledger", lambda: ledger)
    return ledger
