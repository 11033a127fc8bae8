"""Peers from the chain's NodeRegistry (in-process EVM): who may sign peer requests, and where they live."""

from __future__ import annotations

import pytest
from django.test import Client

from backend.ledger.chains import ensure_funds, new_in_process_chain
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, deploy_contracts
from backend.ledger.indexer import EventIndexer
from backend.peers.signing import RequestSigner
from backend.swarm import factory
from backend.swarm.peers import StaticPeerDirectory
from backend.swarm.registry import LedgerPeerDirectory, chain_members
from devnet.consortium import bootstrap_consortium, dev_account

RECEIVER = "0x" + "ab" * 20
ENDPOINTS = ["http://a.test:8000", "http://b.test:8000", "http://c.test:8000"]
HAS_PATH = "/api/swarm/peer/has"


@pytest.fixture(scope="module")
def chain():
    """Three admitted members (a, b, c) and an outsider who never registered."""
    w3 = new_in_process_chain()
    accounts = [dev_account(i, "swarm-registry") for i in range(4)]
    for account in accounts:
        ensure_funds(w3, account.address)
    clients = [ChainClient(w3, account) for account in accounts]
    deployment = deploy_contracts(clients[0])
    ledgers = [Ledger(client, deployment) for client in clients]
    bootstrap_consortium(ledgers[:3], ENDPOINTS)
    return {"ledgers": ledgers, "accounts": accounts}


@pytest.fixture
def on_chain(chain, settings, monkeypatch, tmp_path):
    """This node configured with a shared chain and no DEFL_PEERS: peers come from the registry."""
    from backend.ledger import access as ledger_access

    settings.DEFL_PEERS = []
    settings.DEFL_CHAIN_URL = "http://chain.test:8545"  # never dialled: node_ledger is replaced
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    monkeypatch.setattr(ledger_access, "node_ledger", lambda: chain["ledgers"][0])
    monkeypatch.setattr(factory, "REGISTRY_TTL_S", 0.0)
    monkeypatch.setattr(factory, "own_address", lambda: RECEIVER)  # this node, the requests' receiver
    for cached in (factory.peer_directory, factory.local_store, factory.nonce_cache):
        cached.cache_clear()
    yield chain
    for cached in (factory.peer_directory, factory.local_store, factory.nonce_cache):
        cached.cache_clear()


def _signed_has(account) -> int:
    body = bytes(32)
    headers = RequestSigner(bytes(account.key)).headers(
        "POST", HAS_PATH, body, receiver=factory.own_address()
    )
    response = Client().post(HAS_PATH, data=body, content_type="application/octet-stream", headers=headers)
    return response.status_code


def test_factory_chooses_static_peers_when_configured(on_chain, settings):
    settings.DEFL_PEERS = [f"{on_chain['accounts'][3].address}@http://d.test:8000"]
    directory = factory.peer_directory()
    assert isinstance(directory, StaticPeerDirectory)
    assert directory.is_registered(on_chain["accounts"][3].address)


@pytest.mark.django_db
def test_members_are_peers_with_their_endpoints(on_chain):
    directory = factory.peer_directory()
    assert isinstance(directory, LedgerPeerDirectory)
    members = {p.address: p.url for p in directory.peers()}
    assert members == {a.address: url for a, url in zip(on_chain["accounts"][:3], ENDPOINTS, strict=True)}


@pytest.mark.django_db
def test_mirror_is_read_when_the_indexer_is_current(on_chain, monkeypatch):
    ledger = on_chain["ledgers"][0]
    EventIndexer(ledger.client, ledger.deployment).sync()

    def no_chain_calls():
        raise AssertionError("the registry was read from the chain although the mirror is current")

    monkeypatch.setattr(factory, "chain_members", lambda _registry: no_chain_calls())
    members = {address for address, _ in factory.registry_members()}
    assert members == {a.address for a in on_chain["accounts"][:3]}


def test_directory_caches_and_keeps_the_last_list_when_the_registry_fails(chain):
    registry = chain["ledgers"][0].nodes
    calls = []
    now = [0.0]

    def read():
        calls.append(now[0])
        if len(calls) == 3:
            raise ConnectionError("chain down")
        return chain_members(registry)

    directory = LedgerPeerDirectory(read, ttl_s=5.0, retry_s=1.0, clock=lambda: now[0])
    member = chain["accounts"][1].address
    assert directory.is_registered(member) and directory.is_registered(member.lower())
    assert not directory.is_registered(chain["accounts"][3].address)
    assert not directory.is_registered("not an address")
    assert len(calls) == 1  # cached
    now[0] = 6.0
    assert directory.is_registered(member) and len(calls) == 2
    now[0] = 12.0
    assert directory.is_registered(member) and len(calls) == 3  # failed read: last list kept
    now[0] = 12.5
    assert directory.is_registered(member) and len(calls) == 3  # retried only after retry_s
    now[0] = 13.5
    assert directory.is_registered(member) and len(calls) == 4


def test_directory_fails_closed_before_a_first_list():
    def read():
        raise ConnectionError("chain down")

    directory = LedgerPeerDirectory(read)
    assert directory.peers() == []
    assert not directory.is_registered(dev_account(0, "x").address)


@pytest.mark.django_db
def test_member_accepted_outsider_refused_leaver_refused(on_chain):
    """Runs last: c leaves the consortium for good."""
    a, b, c, outsider = on_chain["accounts"]
    ledger = on_chain["ledgers"][0]
    assert _signed_has(b) == 200
    assert _signed_has(outsider) == 403
    on_chain["ledgers"][2].nodes.leave()
    factory.peer_directory().invalidate()
    assert _signed_has(c) == 403  # read from the chain (nothing indexed)
    assert _signed_has(a) == 200
    EventIndexer(ledger.client, ledger.deployment).sync()
    factory.peer_directory().invalidate()
    assert _signed_has(c) == 403  # read from the mirror
    assert _signed_has(b) == 200


def test_network_follows_the_registry(tmp_path):
    from backend.swarm.network import build_network
    from backend.swarm.store import ChunkStore

    me, b, c = (dev_account(i, "swarm-network") for i in range(3))
    members = [(me.address, "http://me.test"), (b.address, "http://b.test"), (c.address, "http://c.test")]
    directory = LedgerPeerDirectory(lambda: list(members), ttl_s=0.0)
    network = build_network(directory, ChunkStore(tmp_path, fsync=False), bytes(me.key), replication=3)
    try:
        assert [n.peer.address for n in network.nodes] == [me.address, b.address, c.address]
        assert network.nodes[0].local
        client_b = network.nodes[1].transport
        members.pop()  # c leaves
        network.refresh()  # not due yet: an operation keeps its list
        assert len(network.nodes) == 3
        network.refresh(force=True)
        assert [n.peer.address for n in network.nodes] == [me.address, b.address]
        assert network.nodes[1].transport is client_b  # b keeps its pooled connections
    finally:
        network.close()
