"""Fixtures of the jobs tests: node settings (a fresh chunk store), API clients by role."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.nodes.accounts import api_token, create_or_update_user

TEST_NODE_KEY = "0x" + "5d" * 32  # test-only, never funded anywhere


@pytest.fixture(autouse=True)
def node_settings(settings, tmp_path):
    from backend.identity.key import node_account
    from backend.jobs.context import current_node
    from backend.serving.services import model_cache
    from backend.swarm import factory

    settings.DEFL_NODE_KEY = TEST_NODE_KEY
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    settings.DEFL_PEERS = []
    settings.DEFL_REPLICATION = 1

    def clear():
        node_account.cache_clear()
        model_cache.clear()
        current_node.cache_clear()  # a fresh node, with a fresh memory (each make_nodes context has its own)
        for cached in (factory.node_swarm, factory.local_store, factory.peer_directory):
            cached.cache_clear()

    clear()
    yield settings
    clear()


@pytest.fixture
def operator_client(db) -> APIClient:
    user, _ = create_or_update_user("operator-user", Role.OPERATOR, password="correct horse")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client


@pytest.fixture
def viewer_client(db) -> APIClient:
    user, _ = create_or_update_user("viewer-user", Role.VIEWER, password="correct horse")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client
