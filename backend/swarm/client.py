"""Transports to one node's chunks: over signed HTTP to a peer, or directly to the local store.

Both implement ``ChunkTransport``. Transport failures become ``PeerError`` here, at the
client edge (one decorator), so callers never see a ``requests`` exception.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple, ParamSpec, Protocol, TypeVar
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from backend.swarm.errors import ChunkNotFound, CorruptChunk, PeerError
from backend.swarm.signing import RequestSigner
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
        except requests.HTTPError as exc:
            response = exc.response
            raise PeerError(f"{response.url}: HTTP {response.status_code} {response.text[:200]}") from exc
        except (requests.RequestException, ValueError) as exc:
            raise PeerError(str(exc)) from exc

    return wrapper


class PeerClient:
    """Signed requests to one peer over a persistent session (keep-alive, pooled connections)."""

    verified_reads = False  # never trust a peer's bytes: the caller verifies them

    def __init__(
        self, base_url: str, signer: RequestSigner, *, timeout_s: float = 30.0, connect_timeout_s: float = 3.0
    ) -> None:
        if not base_url:
            raise ValueError("a peer client needs the peer's URL")
        self.base_url = base_url.rstrip("/")
        self._prefix = urlsplit(self.base_url).path
        self.signer = signer
        self.timeout = (connect_timeout_s, timeout_s)
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=16))
        self.session.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=16))

    def _post(self, path: str, body: bytes | BatchBody, digest: str | None = None) -> requests.Response:
        headers = self.signer.headers("POST", self._prefix + path, body, digest=digest)
        headers["Content-Type"] = "application/octet-stream"
        response = self.session.post(self.base_url + path, data=body, headers=headers, timeout=self.timeout)
        response.raise_for_status()
        return response

    @_translate_errors
    def push(self, chunks: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
        body = BatchBody(chunks)
        response = self._post(PUSH_PATH, body, body.digest())
        return set(decode_addresses(response.content))

    @_translate_errors
    def fetch(self, addresses: Sequence[bytes]) -> dict[bytes, bytes]:
        response = self._post(FETCH_PATH, encode_addresses(addresses))
        return {a: bytes(d) for a, d in decode_batch(response.content)}

    @_translate_errors
    def has(self, addresses: Sequence[bytes]) -> set[bytes]:
        response = self._post(HAS_PATH, encode_addresses(addresses))
        return set(decode_addresses(response.content))

    @_translate_errors
    def verify(self, addresses: Sequence[bytes]) -> Scrubbed:
        response = self._post(VERIFY_PATH, encode_addresses(addresses))
        good, corrupt = decode_address_lists(response.content)
        return Scrubbed(set(good), set(corrupt))

    def close(self) -> None:
        self.session.close()


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
