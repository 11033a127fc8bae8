"""The peer API's own limits in-process (Django's test client, the test database): rates,
pushed bytes, address counts, and the nonce cache that a node's processes share.

The attacks over real sockets (bodies never read, slow bodies, replays) are in
tests/adversarial/test_hostile_swarm.py.
"""

from __future__ import annotations

import pytest
from django.test import Client
from eth_account import Account

from backend.peers.signing import RequestSigner
from backend.swarm import factory
from backend.swarm.client import FETCH_PATH, HAS_PATH, PUSH_PATH
from backend.swarm.models import PeerRequest
from backend.swarm.reference import chunk_address, encode_span
from backend.swarm.replay import DatabaseNonceCache
from backend.swarm.wire import batch_digest, encode_batch

pytestmark = pytest.mark.django_db

MEMBER = Account.create()
RECEIVER = Account.create().address


@pytest.fixture
def node(settings, tmp_path, monkeypatch):
    settings.DEFL_PEERS = [f"{MEMBER.address}@http://member.test:8000"]
    settings.DEFL_CHAIN_URL = ""
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    monkeypatch.setattr(factory, "own_address", lambda: RECEIVER)
    for cached in (factory.peer_directory, factory.local_store, factory.nonce_cache):
        cached.cache_clear()
    yield settings
    for cached in (factory.peer_directory, factory.local_store, factory.nonce_cache):
        cached.cache_clear()


def post(path: str, body: bytes, *, digest: str | None = None, account=MEMBER):
    headers = RequestSigner(bytes(account.key)).headers("POST", path, body, receiver=RECEIVER, digest=digest)
    return Client().post(path, data=body, content_type="application/octet-stream", headers=headers)


def test_a_peer_over_its_request_rate_gets_429(node):
    node.DEFL_SWARM_PEER_REQUESTS_PER_MIN = 3
    assert [post(HAS_PATH, bytes(32)).status_code for _ in range(3)] == [200, 200, 200]
    refused = post(HAS_PATH, bytes(32))
    assert refused.status_code == 429 and refused["Retry-After"] == "60"
    assert "too many requests" in refused.json()["detail"]


def test_a_peer_over_its_pushed_bytes_gets_429(node):
    node.DEFL_SWARM_PEER_BYTES_PER_MIN = 300
    chunks = [(chunk_address(d), d) for d in (encode_span(100) + bytes(100),)]
    body = encode_batch(chunks)
    assert post(PUSH_PATH, body, digest=batch_digest(body)).status_code == 200
    again = encode_batch([(chunk_address(d), d) for d in (encode_span(150) + bytes(150),)])
    refused = post(PUSH_PATH, again, digest=batch_digest(again))
    assert refused.status_code == 429 and "too many bytes" in refused.json()["detail"]


def test_a_fetch_of_too_many_addresses_is_refused(node):
    assert post(FETCH_PATH, bytes(32) * 64).status_code == 200
    assert post(FETCH_PATH, bytes(32) * 65).status_code == 413  # from the Content-Length


def test_a_body_other_than_the_signed_one_is_refused(node):
    body = bytes(32)
    headers = RequestSigner(bytes(MEMBER.key)).headers("POST", HAS_PATH, body, receiver=RECEIVER)
    other = b"\x01" * 32
    response = Client().post(HAS_PATH, data=other, content_type="application/octet-stream", headers=headers)
    assert response.status_code == 401 and "does not match" in response.json()["detail"]


def test_the_nonce_cache_is_shared_through_the_database_and_forgets_expired_nonces(node):
    first, second = DatabaseNonceCache(), DatabaseNonceCache()  # two processes of one node
    assert first.add("0xabc:nonce-1", 120, signer="0xabc", size=10)
    assert not second.add("0xabc:nonce-1", 120, signer="0xabc", size=10)
    assert second.usage("0xabc", 60) == (1, 10)
    PeerRequest.objects.filter(key="0xabc:nonce-1").update(expires_at=0.0)
    assert second.add("0xabc:nonce-1", 120, signer="0xabc")  # expired: a fresh request again
    third = DatabaseNonceCache(sweep_s=0.0)
    PeerRequest.objects.update(expires_at=0.0)
    third.add("0xdef:nonce-2", 120, signer="0xdef")
    assert list(PeerRequest.objects.values_list("key", flat=True)) == ["0xdef:nonce-2"]
