"""Fixtures of the monitoring tests: this node's key and an empty chunk store of its own."""

from __future__ import annotations

import pytest

TEST_NODE_KEY = "0x" + "6e" * 32  # test-only, never funded anywhere


@pytest.fixture(autouse=True)
def node_settings(settings, tmp_path):
    from backend.identity.key import node_account
    from backend.swarm import factory

    settings.DEFL_NODE_KEY = TEST_NODE_KEY
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    settings.DEFL_PEERS = []
    settings.DEFL_REPLICATION = 1
    settings.DEFL_CONTRACTS_FILE = str(tmp_path / "contracts.json")  # none: no ledger
    caches = (node_account, factory.node_swarm, factory.local_store, factory.peer_directory)
    for cached in caches:
        cached.cache_clear()
    yield settings
    for cached in caches:
        cached.cache_clear()
