"""Signed node-to-node requests.

The sender signs keccak256 of a canonical string over the method, the path (with query),
a timestamp, a random nonce and a hash of the body, with its node key (secp256k1,
recoverable, as Ethereum signs). The body hash is the SHA-256 of the body, except for
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from coincurve import PrivateKey, PublicKey
from eth_utils import keccak, to_checksum_address

from backend.swarm.errors import SignatureError, UnregisteredSigner

HEADER_ADDRESS = "X-Swarm-Address"
HEADER_TIMESTAMP = "X-Swarm-Timestamp"
HEADER_NONCE = "X-Swarm-Nonce"
HEADER_SIGNATURE = "X-Swarm-Signature"
_DOMAIN = b"defl-swarm-peer-request/1"


def body_hash(body: bytes | memoryview) -> str:
    return hashlib.sha256(body).hexdigest()


def request_digest(method: str, path: str, timestamp: str, nonce: str, body_hash: str) -> bytes:
    message = b"\n".join(
        [
            _DOMAIN,
            method.upper().encode(),
            path.encode(),
            timestamp.encode(),
            nonce.encode(),
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
        body: bytes | memoryview,
        *,
        digest: str | None = None,
        now: float | None = None,
    ) -> dict[str, str]:
        timestamp = str(int(now if now is not None else time.time()))
        nonce = os.urandom(16).hex()
        message = request_digest(method, path, timestamp, nonce, digest or body_hash(body))
        signature = self._key.sign_recoverable(message, hasher=None)
        return {
            HEADER_ADDRESS: self.address,
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            HEADER_SIGNATURE: signature.hex(),
        }


class NonceCache(Protocol):
    def add(self, key: str, ttl_s: float) -> bool:
        """Remember ``key`` for ``ttl_s`` seconds; False if it was already there."""
        ...


class MemoryNonceCache:
    """A per-process nonce cache (enough for one gunicorn worker with many threads)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, key: str, ttl_s: float) -> bool:
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


def verify_request(
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | memoryview,
    digest: str | None = None,
    is_registered: Callable[[str], bool],
    nonces: NonceCache,
    max_skew_s: float,
    now: float | None = None,
) -> VerifiedRequest:
    """Check a request's signature, freshness and signer; raise ``SignatureError`` if any fails.

    ``digest`` is the body hash when it is not the plain SHA-256 (a chunk batch).
    """
    try:
        claimed = headers[HEADER_ADDRESS]
        timestamp = headers[HEADER_TIMESTAMP]
        nonce = headers[HEADER_NONCE]
        signature = bytes.fromhex(headers[HEADER_SIGNATURE])
    except (KeyError, ValueError):
        raise SignatureError("unsigned request") from None
    try:
        sent = int(timestamp)
    except ValueError:
        raise SignatureError("bad timestamp") from None
    current = now if now is not None else time.time()
    if abs(current - sent) > max_skew_s:
        raise SignatureError("timestamp outside the clock-skew window")
    if not 16 <= len(nonce) <= 64:
        raise SignatureError("bad nonce")
    message = request_digest(method, path, timestamp, nonce, digest or body_hash(body))
    try:
        public = PublicKey.from_signature_and_message(signature, message, hasher=None)
    except Exception:  # coincurve raises ValueError or its own errors for garbage
        raise SignatureError("bad signature") from None
    signer = to_checksum_address(keccak(public.format(compressed=False)[1:])[-20:])
    if signer.lower() != claimed.lower():
        raise SignatureError("signature does not match the claimed address")
    if not is_registered(signer):
        raise UnregisteredSigner(f"{signer} is not a registered node")
    # Nonces are kept twice the window: a request is fresh for max_skew_s either side.
    if not nonces.add(f"{signer}:{nonce}", 2 * max_skew_s):
        raise SignatureError("replayed request")
    return VerifiedRequest(signer)
