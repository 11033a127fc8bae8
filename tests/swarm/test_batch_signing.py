"""A batch body sent in pieces (wire.BatchBody) is signed by its digest; without one it is refused."""

import os

import pytest
from eth_account import Account

from backend.peers.signing import MemoryNonceCache, RequestSigner, verify_request
from backend.swarm.wire import BatchBody, batch_digest

NODE = Account.create()
RECEIVER = Account.create().address
PATH = "/api/swarm/peer/push"


def test_a_batch_signed_by_its_digest_verifies_against_its_encoded_bytes():
    batch = BatchBody([(os.urandom(32), os.urandom(100)), (os.urandom(32), os.urandom(7))])
    signer = RequestSigner(bytes(NODE.key))
    headers = signer.headers("POST", PATH, batch, receiver=RECEIVER, digest=batch.digest())
    encoded = b"".join(batch)
    assert len(encoded) == len(batch)
    verified = verify_request(
        method="POST",
        path=PATH,
        headers=headers,
        body=encoded,
        receiver=RECEIVER,
        is_registered=lambda a: a == NODE.address,
        nonces=MemoryNonceCache(),
        max_skew_s=60,
        digest=batch_digest(encoded),
    )
    assert verified.signer == NODE.address


def test_a_body_in_pieces_without_its_digest_is_refused():
    batch = BatchBody([(os.urandom(32), os.urandom(10))])
    with pytest.raises(TypeError, match="digest"):
        RequestSigner(bytes(NODE.key)).headers("POST", PATH, batch, receiver=RECEIVER)
