"""The network sink of the put pipeline: each chunk to its R closest nodes, in batches.

Chunks are grouped per target node into batches of 8 MB (one signed HTTP request each:
a receiving node's cost per request, and ours, is paid per 8 chunks rather than per 4)
and sent from the network's thread pool while the pipeline keeps splitting and hashing;
the bytes in flight are capped so memory does not grow with the blob. A batch is sent
as its pieces (``wire.BatchBody``), never joined into one body, so the chunks in flight
exist once and the cap of 48 MB costs ~50 MB. A batch that fails sends its chunks on to
the next closest nodes. ``close`` succeeds only when
every chunk has the required number of acknowledged copies.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from backend.swarm.errors import NotEnoughReplicas, PeerError
from backend.swarm.network import Network, Node
from backend.swarm.store import ChunkStore

Chunk = tuple[bytes, bytes]


class ReplicatingSink:
    def __init__(
        self, network: Network, *, batch_bytes: int = 8 << 20, max_inflight_bytes: int = 48 << 20
    ) -> None:
        self.network = network
        self.batch_bytes = batch_bytes
        self.max_inflight_bytes = max_inflight_bytes
        self._pending: dict[str, list[Chunk]] = {}
        self._pending_size: dict[str, int] = {}
        self._nodes: dict[str, Node] = {n.peer.address: n for n in network.nodes}
        self._acks: dict[bytes, int] = {}
        self._tried: dict[bytes, set[str]] = {}
        self._failed: list[Chunk] = []
        self._inflight = 0
        self._cond = threading.Condition()
        self._futures: list[Future[None]] = []

    # --- the pipeline side (one thread) ------------------------------------------------
    def put(self, address: bytes, data: bytes) -> None:
        if address in self._acks:
            return  # the same chunk twice in one blob (e.g. zero runs): one set of copies
        self._acks[address] = 0
        self._tried[address] = set()
        self._place(address, data, self.network.r)
        self._retry_failed()

    def _place(self, address: bytes, data: bytes, copies: int) -> None:
        tried = self._tried[address]
        for node in self.network.ranked(address, live_only=True):
            if copies <= 0:
                break
            if node.peer.address in tried:
                continue
            tried.add(node.peer.address)
            self._enqueue(node, (address, data))
            copies -= 1

    def _enqueue(self, node: Node, chunk: Chunk) -> None:
        key = node.peer.address
        self._pending.setdefault(key, []).append(chunk)
        self._pending_size[key] = self._pending_size.get(key, 0) + len(chunk[1])
        if self._pending_size[key] >= self.batch_bytes:
            self._flush(key)

    def _flush(self, key: str) -> None:
        batch = self._pending.pop(key, [])
        size = self._pending_size.pop(key, 0)
        if not batch:
            return
        with self._cond:
            while self._inflight and self._inflight + size > self.max_inflight_bytes:
                self._cond.wait()
            self._inflight += size
        self._futures.append(self.network.executor.submit(self._send, self._nodes[key], batch, size))
        self._futures = [f for f in self._futures if not f.done() or f.exception()]

    def _retry_failed(self) -> None:
        with self._cond:
            failed, self._failed = self._failed, []
        for address, data in failed:
            self._place(address, data, 1)

    # --- the pool side -----------------------------------------------------------------
    def _send(self, node: Node, batch: list[Chunk], size: int) -> None:
        try:
            acked = node.transport.push(batch)
        except PeerError:
            self.network.mark_down(node)
            acked = set()
        with self._cond:
            for address, data in batch:
                if address in acked:
                    self._acks[address] += 1
                else:
                    self._failed.append((address, data))
            self._inflight -= size
            self._cond.notify_all()

    # --- the end -------------------------------------------------------------------------
    def close(self) -> None:
        """Send what is pending, re-place failed chunks until none can move, check the counts."""
        while True:
            for key in list(self._pending):
                self._flush(key)
            for future in self._futures:
                future.result()
            self._futures = []
            with self._cond:
                if not self._failed:
                    break
            self._retry_failed()
            if not self._pending:
                break  # failed chunks had no untried node left
        need = self.network.min_replicas
        short = sum(1 for count in self._acks.values() if count < need)
        if short:
            raise NotEnoughReplicas(f"{short} of {len(self._acks)} chunks have fewer than {need} copies")


class LocalCopySink:
    """A pinned put's sink: each chunk to its R closest nodes (``inner``), and a full copy here.

    A chunk whose placement leaves this node out is written to ``store`` as well, so pinning the
    blob needs neither a walk of its tree over the network nor fetching back the chunks just
    handed to other nodes. ``addresses``: every chunk the blob's tree refers to, as often as it
    does (what a walk of the tree yields, so the pins this put adds are the ones unpin removes).
    """

    def __init__(self, inner: ReplicatingSink, store: ChunkStore, network: Network) -> None:
        self.inner = inner
        self.store = store
        self.network = network
        self.addresses: list[bytes] = []
        self._copied: set[bytes] = set()

    def put(self, address: bytes, data: bytes) -> None:
        self.inner.put(address, data)
        self.addresses.append(address)
        if address in self._copied:
            return
        self._copied.add(address)
        if not any(node.local for node in self.network.targets(address)):
            self.store.put(address, data)
