"""Signed node-to-node requests.

The sender signs keccak256 of a canonical string over the method, the path (with query),
a timestamp, a random nonce, the receiver's address, the body's length and a hash of the
body, with its node key (secp256k1, recoverable, as Ethereum signs). The body hash also
travels as a header, so the receiver checks the signature, freshness, receiver and
membership from the headers alone, before it reads a byte of the body
(``verify_headers``), and compares the body with the signed hash once read
(``check_body``). A request is signed for one receiver: replayed to another node, it
names the wrong receiver and is refused. The body hash is the SHA-256 of the body, except for
a batch of chunks, where it is the SHA-256 of the batch's frame headers (addresses and
lengths, ``wire.batch_digest``): each chunk's data is bound to its address by the hash
the receiver checks before storing it, so signing the addresses signs the data too,
and the bytes are hashed once on each side instead of twice. The receiver recovers the signer from the signature,
checks it against the claimed address and the peer directory, refuses timestamps outside
the clock-skew window and nonces it has already seen inside it (replays).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from typing import Protocol

from coincurve import PrivateKey, PublicKey
from eth_utils import keccak, to_checksum_address

from backend.peers.errors import SignatureError, UnregisteredSigner

HEADER_ADDRESS = "X-Swarm-Address"
HEADER_TIMESTAMP = "X-Swarm-Timestamp"
HEADER_NONCE = "X-Swarm-Nonce"
HEADER_SIGNATURE = "X-Swarm-Signature"
HEADER_RECEIVER = "X-Swarm-Receiver"
HEADER_BODY = "X-Swarm-Body-Hash"
_DOMAIN = b"defl-swarm-peer-request/2"


def body_hash(body: bytes | memoryview) -> str:
    return hashlib.sha256(body).hexdigest()


def request_digest(
    method: str, path: str, timestamp: str, nonce: str, receiver: str, length: int, body_hash: str
) -> bytes:
    message = b"\n".join(
        [
            _DOMAIN,
            method.upper().encode(),
            path.encode(),
            timestamp.encode(),
            nonce.encode(),
            receiver.lower().encode(),
            str(length).encode(),
            body_hash.encode(),
        ]
    )
    return keccak(message)


class RequestSigner:
    """Signs requests with a node key (the raw 32-byte secp256k1 private key)."""

    def __init__(self, private_key: bytes) -> None:
        self._key = PrivateKey(bytes(private_key))
        public = self._key.public_key.format(compressed=False)[1:]
        self.address = to_checksum_address(keccak(public)[-20:])

    def headers(
        self,
        method: str,
        path: str,
        body: Sized,
        *,
        receiver: str,
        digest: str | None = None,
        now: float | None = None,
    ) -> dict[str, str]:
        """Headers that sign a request of ``body`` to the node whose address is ``receiver``.

        ``body``: its bytes, or any sized body sent in pieces (a batch) with its ``digest``."""
        timestamp = str(int(now if now is not None else time.time()))
        nonce = os.urandom(16).hex()
        if digest:
            hashed = digest
        elif isinstance(body, bytes | memoryview):
            hashed = body_hash(body)
        else:
            raise TypeError("a body sent in pieces is signed by its digest")
        message = request_digest(method, path, timestamp, nonce, receiver, len(body), hashed)
        signature = self._key.sign_recoverable(message, hasher=None)
        return {
            HEADER_ADDRESS: self.address,
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            HEADER_RECEIVER: receiver,
            HEADER_BODY: hashed,
            HEADER_SIGNATURE: signature.hex(),
        }


class NonceCache(Protocol):
    def add(self, key: str, ttl_s: float, *, signer: str = "", size: int = 0) -> bool:
        """Remember ``key`` for ``ttl_s`` seconds; False if it was already there.

        ``signer`` and ``size`` (the body's length) let a shared cache also count each
        peer's requests and bytes (see ``backend.swarm.replay``).
        """
        ...


class MemoryNonceCache:
    """A per-process nonce cache: for tests and single-process tools. A node's processes
    share ``backend.swarm.replay.DatabaseNonceCache`` instead."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, key: str, ttl_s: float, *, signer: str = "", size: int = 0) -> bool:
        now = time.monotonic()
        with self._lock:
            if len(self._seen) > 10_000:
                self._seen = {k: exp for k, exp in self._seen.items() if exp > now}
            expiry = self._seen.get(key)
            if expiry is not None and expiry > now:
                return False
            self._seen[key] = now + ttl_s
            return True


@dataclass(frozen=True)
class VerifiedRequest:
    signer: str
    nonce: str = ""
    body_hash: str = ""


def verify_headers(
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    length: int,
    receiver: str,
    is_registered: Callable[[str], bool],
    max_skew_s: float,
    now: float | None = None,
) -> VerifiedRequest:
    """Check a request's signature, freshness, receiver and signer from its headers alone.

    Raises ``SignatureError`` (``UnregisteredSigner`` for a valid signature of a
    stranger). The body is not read: ``check_body`` compares it with the signed hash.
    """
    try:
        claimed = headers[HEADER_ADDRESS]
        timestamp = headers[HEADER_TIMESTAMP]
        nonce = headers[HEADER_NONCE]
        to = headers[HEADER_RECEIVER]
        hashed = headers[HEADER_BODY]
        signature = bytes.fromhex(headers[HEADER_SIGNATURE])
    except (KeyError, ValueError):
        raise SignatureError("unsigned request") from None
    if to.lower() != receiver.lower():
        raise SignatureError("the request is signed for another node")
    try:
        sent = int(timestamp)
    except ValueError:
        raise SignatureError("bad timestamp") from None
    current = now if now is not None else time.time()
    if abs(current - sent) > max_skew_s:
        raise SignatureError("timestamp outside the clock-skew window")
    if not 16 <= len(nonce) <= 64 or not nonce.isalnum():
        raise SignatureError("bad nonce")
    if len(hashed) != 64:
        raise SignatureError("bad body hash")
    message = request_digest(method, path, timestamp, nonce, receiver, length, hashed)
    try:
        public = PublicKey.from_signature_and_message(signature, message, hasher=None)
    except Exception:  # coincurve raises ValueError or its own errors for garbage
        raise SignatureError("bad signature") from None
    signer = to_checksum_address(keccak(public.format(compressed=False)[1:])[-20:])
    if signer.lower() != claimed.lower():
        raise SignatureError("signature does not match the claimed address")
    if not is_registered(signer):
        raise UnregisteredSigner(f"{signer} is not a registered node")
    return VerifiedRequest(signer, nonce, hashed)


def check_body(verified: VerifiedRequest, body: bytes | memoryview, digest: str | None = None) -> None:
    """The body read is the one signed (``digest``: its hash when not the plain SHA-256)."""
    if (digest or body_hash(body)) != verified.body_hash:
        raise SignatureError("the body does not match its signature")


def remember_nonce(verified: VerifiedRequest, nonces: NonceCache, max_skew_s: float, size: int = 0) -> None:
    """Refuse a request seen before (within twice the skew window: fresh for max_skew_s either side)."""
    if not nonces.add(
        f"{verified.signer}:{verified.nonce}", 2 * max_skew_s, signer=verified.signer, size=size
    ):
        raise SignatureError("replayed request")


def verify_request(
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | memoryview,
    receiver: str,
    digest: str | None = None,
    is_registered: Callable[[str], bool],
    nonces: NonceCache,
    max_skew_s: float,
    now: float | None = None,
) -> VerifiedRequest:
    """All checks at once, for a body already in hand: headers, nonce, then the body's hash."""
    verified = verify_headers(
        method=method,
        path=path,
        headers=headers,
        length=len(body),
        receiver=receiver,
        is_registered=is_registered,
        max_skew_s=max_skew_s,
        now=now,
    )
    remember_nonce(verified, nonces, max_skew_s, len(body))
    check_body(verified, body, digest)
    return verified
