"""Re-replication: bring every chunk back to R good copies on the R closest live nodes.

Run when a node leaves (its chunks now belong to the next closest node) or a copy was
found missing or corrupt. ``repair_chunks`` checks a set of addresses on each of their
R closest nodes: by default each node scrubs its copies (re-reads and re-hashes them,
quarantining corrupt ones: ``ChunkTransport.verify``), so a corrupted replica anywhere
is found and replaced without waiting for a read to stumble on it; ``verify=False``
only asks whether the copies exist. ``repair_node`` first scrubs this node's own store
and then repairs everything it holds, which is how the store heals without a
coordinator: each node looks after the chunks it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from backend.swarm.download import NetworkSource
from backend.swarm.errors import ChunkNotFound, CorruptChunk, PeerError
from backend.swarm.network import Network, Node
from backend.swarm.store import ChunkStore


@dataclass
class RepairReport:
    checked: int = 0
    copies_added: int = 0
    corrupt_local: int = 0  # found by this node's scrub of its whole store
    corrupt_copies: int = 0  # found by the responsible nodes' scrubs of the repaired chunks
    lost: int = 0  # chunks no live node has a good copy of


def _batches(items: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def repair_chunks(
    network: Network,
    addresses: Iterable[bytes],
    *,
    verify: bool = True,
    batch: int = 256,
    verify_batch: int = 32,
    progress: Callable[[int], None] | None = None,
    report: RepairReport | None = None,
) -> RepairReport:
    report = report or RepairReport()
    network.probe()
    source = NetworkSource(network, repair=False)
    for group in _batches(addresses, batch):
        targets = {a: network.targets(a) for a in group}
        held: dict[str, set[bytes]] = {}
        for node in {n.peer.address: n for ts in targets.values() for n in ts}.values():
            asked = [a for a, ts in targets.items() if node in ts]
            try:
                held[node.peer.address] = _held(node, asked, verify, verify_batch, report)
            except PeerError:
                network.mark_down(node)
                held[node.peer.address] = set()
        missing = {a: [n for n in ts if a not in held[n.peer.address]] for a, ts in targets.items()}
        missing = {a: ns for a, ns in missing.items() if ns}
        for address, nodes in missing.items():
            try:
                data = source.fetch_batch([address])[address]
            except ChunkNotFound:
                report.lost += 1
                continue
            for node in nodes:
                try:
                    report.copies_added += len(node.transport.push([(address, data)]))
                except PeerError:
                    network.mark_down(node)
        report.checked += len(group)
        if progress:
            progress(report.checked)
    return report


def _held(
    node: Node, asked: list[bytes], verify: bool, verify_batch: int, report: RepairReport
) -> set[bytes]:
    """The asked chunks the node has a good copy of (re-hashed there when ``verify``)."""
    if not verify:
        return node.transport.has(asked)
    good: set[bytes] = set()
    for part in _batches(asked, verify_batch):  # a scrub reads every byte: keep requests short
        scrubbed = node.transport.verify(part)
        good |= scrubbed.good
        report.corrupt_copies += len(scrubbed.corrupt)
    return good


def scrub_store(store: ChunkStore) -> int:
    """Read and verify every local chunk; corrupt ones are quarantined. Returns how many."""
    corrupt = 0
    for address in store.addresses():
        try:
            store.get(address)
        except CorruptChunk:
            corrupt += 1
        except ChunkNotFound:
            continue
    return corrupt


def repair_node(
    network: Network,
    store: ChunkStore,
    *,
    scrub: bool = True,
    verify: bool = True,
    progress: Callable[[int], None] | None = None,
) -> RepairReport:
    """Scrub this node's store, then re-replicate every chunk it holds or held."""
    report = RepairReport()
    before = list(store.addresses())
    if scrub:
        report.corrupt_local = scrub_store(store)
    return repair_chunks(network, before, verify=verify, progress=progress, report=report)
