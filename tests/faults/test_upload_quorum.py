"""Three storage nodes at R=3 with one of them down: uploads still succeed, and repair later
brings every chunk back to three copies.

Before, an upload needed all R acknowledged copies, so three nodes at R=3 refused every write
(NotEnoughReplicas) while any one of them was down, and a federation of three failed its round
with it. An upload now needs a majority of R (DEFL_SWARM_MIN_REPLICAS, when set, still rules);
the copy it could not place is added by the holders' scheduled repair once the node is back.
In-process nodes (real chunk stores on disk behind the local transport).
"""

from __future__ import annotations

import os

import pytest

from backend.swarm.api import Swarm
from backend.swarm.errors import NotEnoughReplicas, PeerError
from backend.swarm.network import Network
from backend.swarm.placement import upload_quorum
from backend.swarm.repair_schedule import RepairSchedule
from tests.swarm.helpers import local_network

SIZE = 64 << 10


def _down(*_args, **_kwargs):
    raise PeerError("connection refused")


def _take_down(node) -> dict:
    """Make ``node`` refuse every request (as a killed process does); returns what restores it."""
    saved = {name: getattr(node.transport, name) for name in ("push", "fetch", "has")}
    for name in saved:
        setattr(node.transport, name, _down)
    return saved


def _bring_back(node, saved: dict) -> None:
    for name, method in saved.items():
        setattr(node.transport, name, method)


def _copies(stores, address: bytes) -> int:
    return sum(1 for store in stores if store.has(address))


def test_majority_of_r():
    assert [upload_quorum(r) for r in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_three_nodes_at_r3_upload_with_one_down_and_repair_restores_three_copies(tmp_path):
    network, stores = local_network(tmp_path, 3, replication=3)
    try:
        swarm = Swarm(stores[0], network, chunk_size=SIZE, batch_bytes=SIZE * 4)
        gone = network.nodes[2]
        saved = _take_down(gone)
        data = os.urandom(SIZE * 6 + 7)
        ref = swarm.put(data)  # NotEnoughReplicas before the fix
        addresses = swarm.chunk_addresses(ref)
        assert all(_copies(stores, a) == 2 and not stores[2].has(a) for a in addresses)
        assert swarm.read(ref, max_bytes=len(data)) == data

        # While it is still down, a repair finds no node to add the copy to: nothing lost.
        schedule = RepairSchedule(lambda: swarm.repair(None), interval_s=60, first_delay_s=0)
        schedule.run_once()
        assert schedule.last_report.lost == 0 and schedule.failures == 0
        assert all(_copies(stores, a) == 2 for a in addresses)

        # Back (same key, empty store): the scheduled repair, run by itself, adds the third copy.
        _bring_back(gone, saved)
        network._down.clear()  # what its down-marking expiring (down_for_s) does
        schedule.run_once()
        assert schedule.failures == 0 and schedule.last_report.copies_added >= len(addresses)
        assert all(_copies(stores, a) == 3 for a in addresses)
    finally:
        network.close()


def test_two_of_three_down_still_refuse_the_upload(tmp_path):
    network, stores = local_network(tmp_path, 3, replication=3)
    try:
        for node in network.nodes[1:]:
            _take_down(node)
        swarm = Swarm(stores[0], network, chunk_size=SIZE)
        with pytest.raises(NotEnoughReplicas):
            swarm.put(os.urandom(SIZE * 3))  # one copy (this node's) is short of a majority
    finally:
        network.close()


def test_an_explicit_minimum_still_rules(tmp_path):
    nodes, stores = local_network(tmp_path, 3, replication=3)
    nodes.close()  # only its nodes (stores behind local transports) are used, in a network of R=3 copies
    network = Network(nodes.nodes, replication=3, min_replicas=3, threads=2)
    try:
        _take_down(network.nodes[2])
        assert network.min_replicas == 3
        with pytest.raises(NotEnoughReplicas):
            Swarm(stores[0], network, chunk_size=SIZE).put(os.urandom(SIZE * 3))
    finally:
        network.close()
