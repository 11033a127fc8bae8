"""Signed peer requests: a good one passes; unsigned, tampered, stale, unregistered, replayed fail."""

import pytest
from eth_account import Account

from backend.peers.errors import SignatureError, UnregisteredSigner
from backend.peers.signing import MemoryNonceCache, RequestSigner, verify_request

NODE = Account.create()
STRANGER = Account.create()
RECEIVER = Account.create().address


def verify(headers, *, body=b"body", path="/api/swarm/peer/has", nonces=None, now=None, receiver=RECEIVER):
    return verify_request(
        method="POST",
        path=path,
        headers=headers,
        body=body,
        receiver=receiver,
        is_registered=lambda a: a == NODE.address,
        nonces=nonces or MemoryNonceCache(),
        max_skew_s=60,
        now=now,
    )


def signed(account=NODE, body=b"body", path="/api/swarm/peer/has", now=None):
    return RequestSigner(bytes(account.key)).headers("POST", path, body, receiver=RECEIVER, now=now)


def test_valid_request_names_its_signer():
    assert verify(signed()).signer == NODE.address


def test_unsigned_and_tampered_requests_are_refused():
    with pytest.raises(SignatureError, match="unsigned"):
        verify({})
    with pytest.raises(SignatureError):
        verify(signed(), body=b"other body")
    with pytest.raises(SignatureError):
        verify(signed(), path="/api/swarm/peer/chunks")


def test_unregistered_signer_is_refused():
    with pytest.raises(UnregisteredSigner):
        verify(signed(STRANGER))


def test_claiming_another_address_is_refused():
    headers = signed(STRANGER)
    headers["X-Swarm-Address"] = NODE.address
    with pytest.raises(SignatureError, match="claimed"):
        verify(headers)


def test_replay_and_stale_timestamps_are_refused():
    nonces = MemoryNonceCache()
    headers = signed()
    verify(headers, nonces=nonces)
    with pytest.raises(SignatureError, match="replayed"):
        verify(headers, nonces=nonces)
    with pytest.raises(SignatureError, match="clock-skew"):
        verify(signed(now=1_000_000), now=1_000_000 + 61)
    verify(signed(now=1_000_000), now=1_000_000 + 59)


def test_a_signed_batch_binds_its_chunks_through_their_addresses():
    from backend.swarm.reference import chunk_address, is_valid_chunk
    from backend.swarm.wire import batch_digest, decode_batch, encode_batch

    data = b"chunk data"
    body = encode_batch([(chunk_address(data), data)])
    headers = RequestSigner(bytes(NODE.key)).headers(
        "POST", "/p", body, receiver=RECEIVER, digest=batch_digest(body)
    )
    ok = verify_request(
        method="POST", path="/p", headers=headers, body=body, digest=batch_digest(body), receiver=RECEIVER,
        is_registered=lambda a: True, nonces=MemoryNonceCache(), max_skew_s=60,
    )  # fmt: skip
    assert ok.signer == NODE.address
    # Swapping the data keeps the signature valid, but the chunk no longer matches its address.
    tampered = body[:-1] + b"X"
    [(address, payload)] = list(decode_batch(tampered))
    assert not is_valid_chunk(address, payload)
    # Changing an address or a length changes the signed digest.
    assert batch_digest(bytes([body[0] ^ 1]) + body[1:]) != batch_digest(body)


def test_a_batch_sent_in_pieces_is_the_encoded_batch_with_the_same_digest():
    from backend.swarm.reference import chunk_address
    from backend.swarm.wire import BatchBody, batch_digest, encode_batch

    chunks = [(chunk_address(d), d) for d in (b"a" * 100, bytearray(b"b" * 7), memoryview(b"c" * 3000))]
    pieces = BatchBody(chunks)
    body = encode_batch(chunks)
    assert b"".join(pieces) == body and len(pieces) == len(body)
    assert pieces.digest() == batch_digest(body)


def test_a_request_is_signed_for_one_receiver():
    headers = signed()
    with pytest.raises(SignatureError, match="another node"):
        verify(headers, receiver=Account.create().address)
    # Rewriting the receiver header to the new node's address breaks the signature.
    other = Account.create().address
    headers["X-Swarm-Receiver"] = other
    with pytest.raises(SignatureError, match="claimed"):
        verify(headers, receiver=other)


def test_the_signed_length_and_body_hash_are_checked():
    from backend.peers.signing import check_body, verify_headers

    headers = signed(body=b"body")
    common = dict(
        method="POST", path="/api/swarm/peer/has", headers=headers, receiver=RECEIVER,
        is_registered=lambda a: True, max_skew_s=60,
    )  # fmt: skip
    with pytest.raises(SignatureError):
        verify_headers(length=5, **common)  # a different Content-Length than signed
    verified = verify_headers(length=4, **common)  # decided before any body byte is read
    check_body(verified, b"body")
    with pytest.raises(SignatureError, match="does not match"):
        check_body(verified, b"bodY")
