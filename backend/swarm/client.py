"""Transports to one node's chunks: over signed HTTP to a peer, or directly to the local store.

Both implement ``ChunkTransport``. Transport failures become ``PeerError`` here, at the
client edge (one decorator), so callers never see a ``requests`` exception.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, ParamSpec, Protocol, TypeVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from backend.peers.endpoints import EndpointGuard
from backend.peers.signing import RequestSigner
from backend.swarm.errors import ChunkNotFound, CorruptChunk, PeerError
from backend.swarm.reference import ADDRESS_SIZE, MAX_CHUNK_BYTES
from backend.swarm.store import ChunkStore
from backend.swarm.wire import (
    BatchBody,
    decode_address_lists,
    decode_addresses,
    decode_batch,
    encode_addresses,
)

P = ParamSpec("P")
R = TypeVar("R")

PUSH_PATH = "/api/swarm/peer/chunks"
FETCH_PATH = "/api/swarm/peer/fetch"
HAS_PATH = "/api/swarm/peer/has"
VERIFY_PATH = "/api/swarm/peer/verify"
# Addresses a peer accepts in one ``has`` request (views.py); longer lists are split.
MAX_HAS_ADDRESSES = 16384


class Scrubbed(NamedTuple):
    """A node's answer to a scrub: copies it re-hashed good, and copies found corrupt (now quarantined)."""

    good: set[bytes]
    corrupt: set[bytes]


class ChunkTransport(Protocol):
    # True when fetch() returns only chunks already verified against their address
    # (the local store verifies every read), so the caller need not hash them again.
    verified_reads: bool

    def push(self, chunks: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
        """Store chunks on the node; return the addresses it acknowledged."""
        ...

    def fetch(self, addresses: Sequence[bytes]) -> dict[bytes, bytes]:
        """The chunks the node returned (unverified: the caller checks every one)."""
        ...

    def has(self, addresses: Sequence[bytes]) -> set[bytes]:
        """The addresses the node says it holds."""
        ...

    def verify(self, addresses: Sequence[bytes]) -> Scrubbed:
        """Have the node re-read and re-hash its copies of ``addresses`` (a scrub)."""
        ...


def _translate_errors(func: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (requests.RequestException, ValueError) as exc:
            raise PeerError(str(exc)) from exc

    return wrapper


# The most a peer's answer may hold: a fetch's chunks with their frame headers, and
# address lists. Larger answers are cut off and refused, never read into memory.
_FRAME = ADDRESS_SIZE + 4
_ERROR_EXCERPT = 200


class PeerClient:
    """Signed requests to one peer over a persistent session (keep-alive, pooled connections).

    Every request is signed for this peer's address (a copy replayed to another node is
    refused there), redirects are refused, the endpoint's addresses are checked before
    each request (endpoints.py), and answers are read against a size limit and a deadline.
    """

    verified_reads = False  # never trust a peer's bytes: the caller verifies them

    def __init__(
        self,
        base_url: str,
        signer: RequestSigner,
        *,
        receiver: str,
        allow_private: bool = False,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 3.0,
        on_transfer: Callable[[str, int], None] | None = None,
    ) -> None:
        if not base_url:
            raise ValueError("a peer client needs the peer's URL")
        self.base_url = base_url.rstrip("/")
        self._prefix = urlsplit(self.base_url).path
        self.signer = signer
        self.receiver = receiver
        self.guard = EndpointGuard(self.base_url, allow_private=allow_private)
        self.timeout_s = timeout_s
        self.timeout = (connect_timeout_s, timeout_s)
        self.on_transfer = on_transfer  # (direction "sent" | "received", chunk bytes): the node's metrics
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=16))
        self.session.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=16))

    def _post(self, path: str, body: bytes | BatchBody, limit: int, digest: str | None = None) -> bytes:
        """POST a signed body; the answer's bytes, at most ``limit`` of them."""
        self.guard.check()
        headers = self.signer.headers(
            "POST", self._prefix + path, body, receiver=self.receiver, digest=digest
        )
        headers["Content-Type"] = "application/octet-stream"
        deadline = time.monotonic() + 2 * self.timeout_s
        with self.session.post(
            self.base_url + path,
            data=body,
            headers=headers,
            timeout=self.timeout,
            allow_redirects=False,
            stream=True,
        ) as response:
            if response.status_code != 200:
                excerpt = _read_capped(response, _ERROR_EXCERPT, deadline, cut=True)
                raise PeerError(
                    f"peer {self.receiver}: HTTP {response.status_code} {excerpt.decode('utf-8', 'replace')}"
                )
            return _read_capped(response, limit, deadline)

    @_translate_errors
    def push(self, chunks: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
        body = BatchBody(chunks)
        answer = self._post(PUSH_PATH, body, len(body.chunks) * ADDRESS_SIZE, body.digest())
        self._transferred("sent", sum(len(data) for _, data in chunks))
        return set(decode_addresses(answer))

    @_translate_errors
    def fetch(self, addresses: Sequence[bytes]) -> dict[bytes, bytes]:
        limit = len(addresses) * (_FRAME + MAX_CHUNK_BYTES)
        answer = self._post(FETCH_PATH, encode_addresses(addresses), limit)
        asked = set(addresses)
        found = {a: bytes(d) for a, d in decode_batch(answer) if a in asked and len(d) <= MAX_CHUNK_BYTES}
        self._transferred("received", sum(len(d) for d in found.values()))
        return found

    def _transferred(self, direction: str, size: int) -> None:
        if self.on_transfer is not None:
            self.on_transfer(direction, size)

    @_translate_errors
    def has(self, addresses: Sequence[bytes]) -> set[bytes]:
        held: set[bytes] = set()
        for i in range(0, max(len(addresses), 1), MAX_HAS_ADDRESSES):
            group = addresses[i : i + MAX_HAS_ADDRESSES]
            answer = self._post(HAS_PATH, encode_addresses(group), len(group) * ADDRESS_SIZE)
            held.update(decode_addresses(answer))
        return held

    @_translate_errors
    def verify(self, addresses: Sequence[bytes]) -> Scrubbed:
        answer = self._post(VERIFY_PATH, encode_addresses(addresses), 8 + len(addresses) * ADDRESS_SIZE)
        good, corrupt = decode_address_lists(answer)
        return Scrubbed(set(good), set(corrupt))

    def close(self) -> None:
        self.session.close()


def _read_capped(response: requests.Response, limit: int, deadline: float, *, cut: bool = False) -> bytes:
    """At most ``limit`` bytes of an answer, read before ``deadline``; more is a ``PeerError``
    (or, with ``cut``, cut off: an error's excerpt)."""
    declared = response.headers.get("Content-Length")
    if not cut and declared is not None and declared.isdigit() and int(declared) > limit:
        raise PeerError(f"answer larger than {limit} bytes")
    got = bytearray()
    for piece in response.raw.stream(64 << 10, decode_content=False):
        got += piece
        if len(got) > limit:
            if cut:
                return bytes(got[:limit])
            raise PeerError(f"answer larger than {limit} bytes")
        if time.monotonic() > deadline:
            raise PeerError("answer too slow")
    return bytes(got)


class LocalTransport:
    """This node's own store behind the same interface, so placement treats it like any node.

    Pushes are not re-hashed: they come from this process, whose pipeline just computed
    the addresses (or from repair, which verified what it fetched). Reads are verified
    by the store, which quarantines a corrupt file (so a good copy can be written back).
    """

    verified_reads = True

    def __init__(self, store: ChunkStore) -> None:
        self.store = store

    def push(self, chunks: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
        return set(self.store.put_many(chunks, verify=False))

    def fetch(self, addresses: Sequence[bytes]) -> dict[bytes, bytes]:
        found = {}
        for address in addresses:
            try:
                found[address] = self.store.get(address)
            except (ChunkNotFound, CorruptChunk):
                continue  # a corrupt copy was quarantined by the store; the caller falls back
        return found

    def has(self, addresses: Sequence[bytes]) -> set[bytes]:
        return set(self.store.has_many(addresses))

    def verify(self, addresses: Sequence[bytes]) -> Scrubbed:
        good, corrupt = self.store.verify_many(addresses)
        return Scrubbed(set(good), set(corrupt))

    def close(self) -> None:
        pass
