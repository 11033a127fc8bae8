"""Fixtures of the backend API tests: a node key, a fresh chunk store, users of each role."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from backend.nodes.accounts import api_token, create_or_update_user
from backend.nodes.roles import Role

# A fixed, test-only key (never funded anywhere): the node's identity in these tests.
TEST_NODE_KEY = "0x" + "4c" * 32


def _clear_node_caches() -> None:
    from backend.nodes.identity import node_account
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


@pytest.fixture
def make_client(db):
    def make(role: Role | None) -> APIClient:
        client = APIClient()
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
    return APIClient()
