"""Placement, replicated upload, fallback, read repair and repair over in-process nodes."""

import io
import os

import pytest

from backend.swarm import api
from backend.swarm.api import Swarm
from backend.swarm.errors import NotEnoughReplicas, PeerError
from backend.swarm.placement import overlay_address, xor_distance
from tests.swarm.helpers import local_network

SIZE = 64 << 10


@pytest.fixture
def four(tmp_path):
    network, stores = local_network(tmp_path, 4)
    swarm = Swarm(stores[0], network, chunk_size=SIZE, batch_bytes=SIZE * 4)
    yield swarm, network, stores
    network.close()


def holders(stores, address):
    return [i for i, s in enumerate(stores) if s.has(address)]


def test_overlay_and_distance():
    assert overlay_address("0x" + "00" * 20) == overlay_address("0x" + "00" * 20)
    assert xor_distance(b"\x01", b"\x03") == 2


def test_each_chunk_lives_on_its_three_closest_nodes(four):
    swarm, network, stores = four
    ref = swarm.put(os.urandom(SIZE * 20 + 5))
    addresses = swarm.chunk_addresses(ref)
    assert len(addresses) == 22
    index = {n.peer.address: i for i, n in enumerate(network.nodes)}
    for address in addresses:
        closest = sorted(index[n.peer.address] for n in network.ranked(address)[:3])
        assert holders(stores, address) == closest


def test_download_falls_back_and_repairs_corrupt_and_missing_copies(four):
    swarm, network, stores = four
    data = os.urandom(SIZE * 12)
    ref = swarm.put(data)
    addresses = swarm.chunk_addresses(ref)
    # Corrupt every copy held by the closest node of each chunk; delete some second copies.
    broken = 0
    for address in addresses:
        first, second = network.ranked(address)[:2]
        path = first.transport.store.path(address)
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
        broken += 1
        second.transport.store.delete(address)
    assert swarm.read(ref, max_bytes=len(data)) == data
    stats = swarm.last_fetch_stats
    assert stats.missing + stats.corrupt >= broken and stats.repaired >= broken
    for address in addresses:
        for node in network.ranked(address)[:3]:
            assert node.transport.store.get(address)  # verified good copy again


def test_node_leaving_then_repair_restores_three_copies(four):
    swarm, network, stores = four
    ref = swarm.put(os.urandom(SIZE * 10))
    gone = network.nodes[3]

    def down(*_a, **_k):
        raise PeerError("down")

    gone.transport.push = gone.transport.fetch = gone.transport.has = down
    report = swarm.repair(ref)
    assert report.lost == 0 and report.copies_added > 0
    for address in swarm.chunk_addresses(ref):
        live = [n for n in network.nodes if n is not gone and n.transport.store.has(address)]
        assert len(live) == 3


def test_upload_fails_without_enough_replicas(tmp_path):
    # Two of three down: one copy, short of the majority of R an upload needs (one down is
    # enough copies: tests/faults/test_upload_quorum.py).
    network, stores = local_network(tmp_path, 3, replication=3)

    def down(*_a, **_k):
        raise PeerError("down")

    network.nodes[1].transport.push = network.nodes[2].transport.push = down
    swarm = Swarm(stores[0], network, chunk_size=SIZE)
    with pytest.raises(NotEnoughReplicas):
        swarm.put(os.urandom(SIZE * 3))
    network.close()


def test_pin_keeps_a_local_copy_and_gc_drops_what_is_not_ours(four):
    swarm, network, stores = four
    ref = swarm.put(os.urandom(SIZE * 10))
    me = network.nodes[0].peer.address
    assert swarm.pin(ref) == 11
    assert all(stores[0].has(a) for a in swarm.chunk_addresses(ref))
    swarm.gc(grace_s=0)
    assert all(stores[0].has(a) for a in swarm.chunk_addresses(ref))
    swarm.unpin(ref)
    swarm.gc(grace_s=0)
    for address in swarm.chunk_addresses(ref):
        ours = any(n.peer.address == me for n in network.ranked(address)[:3])
        assert stores[0].has(address) == ours
    assert swarm.stat(ref).size == SIZE * 10


def test_a_pinned_put_keeps_every_chunk_here_without_fetching_any_back(four):
    swarm, network, stores = four
    fetched: list[int] = []
    for node in network.nodes[1:]:
        fetch = node.transport.fetch
        node.transport.fetch = lambda wanted, fetch=fetch: fetched.append(len(wanted)) or fetch(wanted)
    # 40 leaves: this node is among a chunk's R=3 of 4 nearest with odds 3/4, so 10 leaves left
    # every chunk here one run in 25 (no chunk placed elsewhere, the case this test is about).
    ref = swarm.put(os.urandom(SIZE * 40), pin=True)
    assert fetched == []  # no walk of the tree over the network, no chunk fetched back
    addresses = swarm.chunk_addresses(ref)
    placed_elsewhere = [a for a in addresses if not any(n.local for n in network.ranked(a)[:3])]
    assert placed_elsewhere  # the case that needed fetching back: this node is not among R
    assert all(stores[0].has(a) and stores[0].pins(a) == 1 for a in addresses)
    swarm.unpin(ref)
    assert all(stores[0].pins(a) == 0 for a in addresses)
    swarm.gc(grace_s=0)
    for address in addresses:
        assert stores[0].has(address) == (address not in placed_elsewhere)


def test_a_pinned_put_pins_a_repeated_chunk_as_often_as_unpin_removes_it(four):
    swarm, _, stores = four
    ref = swarm.put(bytes(SIZE * 4), pin=True)  # four equal leaves, one address
    leaf = swarm.chunk_addresses(ref)[1]
    assert stores[0].pins(leaf) == 4
    swarm.unpin(ref)
    assert stores[0].pins(leaf) == 0


def _corrupt(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_repair_finds_corrupt_copies_on_other_nodes_and_replaces_them(four):
    swarm, network, stores = four
    ref = swarm.put(os.urandom(SIZE * 10))
    # Corrupt one copy of each leaf on a node other than this one (node 0); not the root,
    # which repair reads (walking the tree) and so read-repairs on the way.
    addresses = swarm.chunk_addresses(ref)[1:]
    for address in addresses:
        other = next(n for n in network.ranked(address)[:3] if not n.local)
        _corrupt(other.transport.store.path(address))
    quick = swarm.repair(ref, verify=False)
    assert quick.copies_added == 0 and quick.corrupt_copies == 0  # existence checks see nothing wrong
    report = swarm.repair(ref)
    assert report.corrupt_copies == len(addresses)
    assert report.copies_added == len(addresses) and report.lost == 0
    for address in addresses:
        for node in network.ranked(address)[:3]:
            assert node.transport.store.get(address)  # a verified good copy on every responsible node
    assert swarm.repair(ref).corrupt_copies == 0


def test_node_repair_scrubs_the_other_copies_of_what_it_holds(four):
    swarm, network, stores = four
    ref = swarm.put(os.urandom(SIZE * 8))
    ours = [a for a in swarm.chunk_addresses(ref)[1:] if stores[0].has(a)]
    victim = {}
    for address in ours:
        other = next(n for n in network.ranked(address)[:3] if not n.local)
        _corrupt(other.transport.store.path(address))
        victim[address] = other
    report = swarm.repair()
    assert report.corrupt_copies == len(ours) and report.copies_added == len(ours)
    for address, node in victim.items():
        assert node.transport.store.get(address)


def test_scrub_answer_wire_format():
    from backend.swarm.wire import decode_address_lists, encode_address_lists

    good, bad = [bytes([1]) * 32, bytes([2]) * 32], [bytes([3]) * 32]
    assert decode_address_lists(encode_address_lists([good, bad])) == [good, bad]
    assert decode_address_lists(encode_address_lists([[], []])) == [[], []]
    with pytest.raises(ValueError):
        decode_address_lists(encode_address_lists([good, bad])[:-1])


def test_get_into_a_file_syncs_it_as_it_grows(four, tmp_path, monkeypatch):
    swarm, _, _ = four
    data = os.urandom(SIZE * 40 + 7)
    ref = swarm.put(data)
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(api.os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_size) or real(fd))
    monkeypatch.setattr(api._Writeback, "every", SIZE * 8)
    out = tmp_path / "out.bin"
    with open(out, "wb") as f:
        assert swarm.get(ref, f, max_bytes=len(data)) == len(data)
    assert out.read_bytes() == data
    assert synced and all(0 < size < len(data) for size in synced)  # while it grew; the tail is the caller's
    buffer = io.BytesIO()  # not a file: nothing to sync, same bytes
    assert swarm.get(ref, buffer, max_bytes=len(data)) == len(data) and buffer.getvalue() == data
