"""A storage node lost for good: its blobs stay readable at R=3, and the nodes' scheduled repair
restores three live copies of every chunk by itself, within a bounded time.

Five nodes, each with its own chunk store on disk and its own view of the network (itself
local, the others behind transports), hold a job's blobs at R=3. One node's chunk directory is
deleted and the node goes away. Nobody calls repair: each survivor's RepairSchedule (the one its
agent runs, backend/swarm/repair_schedule.py) does, on a short interval.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from eth_account import Account

from backend.swarm.api import Swarm
from backend.swarm.client import LocalTransport
from backend.swarm.errors import PeerError
from backend.swarm.network import Network, Node
from backend.swarm.peers import Peer
from backend.swarm.repair_schedule import RepairSchedule
from backend.swarm.store import ChunkStore

SIZE = 64 << 10
NODES = 5


class LostTransport(LocalTransport):
    """A node that is gone: every request to it fails as a dead peer does."""

    def __init__(self, store):
        super().__init__(store)
        self.lost = False

    def _check(self):
        if self.lost:
            raise PeerError("connection refused")

    def push(self, *args, **kwargs):
        self._check()
        return super().push(*args, **kwargs)

    def fetch(self, *args, **kwargs):
        self._check()
        return super().fetch(*args, **kwargs)

    def has(self, *args, **kwargs):
        self._check()
        return super().has(*args, **kwargs)

    def verify(self, *args, **kwargs):
        self._check()
        return super().verify(*args, **kwargs)


@pytest.fixture
def five(tmp_path):
    stores = [ChunkStore(tmp_path / f"node{i}", fsync=False) for i in range(NODES)]
    peers = [Peer(Account.create().address, "") for _ in range(NODES)]
    transports = [LostTransport(store) for store in stores]
    swarms, networks = [], []
    for me in range(NODES):
        nodes = [Node(peers[i], transports[i], local=i == me) for i in range(NODES)]
        network = Network(nodes, replication=3, threads=2)
        networks.append(network)
        swarms.append(Swarm(stores[me], network, chunk_size=SIZE, batch_bytes=SIZE * 4))
    yield swarms, stores, transports, tmp_path
    for network in networks:
        network.close()


def live_copies(stores, lost: int, address: bytes) -> int:
    return sum(1 for i, store in enumerate(stores) if i != lost and store.has(address))


def test_lost_storage_node_is_made_up_for_by_the_scheduled_repair(five):
    swarms, stores, transports, root = five
    blobs = {swarms[0].put(os.urandom(SIZE * 9 + 1)): None, swarms[1].put(os.urandom(SIZE * 7)): None}
    for ref in blobs:
        blobs[ref] = swarms[2].read(ref, max_bytes=SIZE * 10)
    addresses = {a for ref in blobs for a in swarms[0].chunk_addresses(ref)}
    # The node holding the most chunks is lost for good: disk gone, process gone.
    lost = max(range(1, NODES), key=lambda i: sum(stores[i].has(a) for a in addresses))
    held = [a for a in addresses if stores[lost].has(a)]
    assert held
    shutil.rmtree(root / f"node{lost}")
    transports[lost].lost = True
    assert any(live_copies(stores, lost, a) < 3 for a in addresses)

    # Every blob stays readable from the two copies left of each chunk.
    for ref, data in blobs.items():
        assert swarms[0].read(ref, max_bytes=len(data)) == data

    stop = threading.Event()
    schedules = [
        RepairSchedule(lambda s=swarm: s.repair(None), interval_s=0.5, first_delay_s=0.1)
        for i, swarm in enumerate(swarms)
        if i != lost
    ]
    started = time.monotonic()
    for schedule in schedules:
        schedule.start(stop)
    try:
        deadline = started + 60
        while time.monotonic() < deadline and any(live_copies(stores, lost, a) < 3 for a in addresses):
            time.sleep(0.2)
        restored_s = time.monotonic() - started
        # One survivor's first run can restore every copy before a loaded machine has started
        # another's thread: every schedule is given until the deadline to run once.
        while time.monotonic() < deadline and any(schedule.runs < 1 for schedule in schedules):
            time.sleep(0.05)
    finally:
        stop.set()
    short = {a.hex(): live_copies(stores, lost, a) for a in addresses if live_copies(stores, lost, a) < 3}
    assert not short, f"not back to 3 live copies after {restored_s:.1f}s: {short}"
    assert all(schedule.runs >= 1 for schedule in schedules)
    print(f"replica count restored by the schedule in {restored_s:.1f}s")


def test_a_failing_run_is_logged_and_the_schedule_goes_on():
    calls = []

    def run():
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise PeerError("every peer away")
        return "ok"

    stop = threading.Event()
    schedule = RepairSchedule(run, interval_s=0.05, first_delay_s=0.0)
    thread = schedule.start(stop)
    deadline = time.monotonic() + 30
    while schedule.runs < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(5)
    assert schedule.failures == 1 and schedule.runs >= 3 and schedule.last_report == "ok"
    with pytest.raises(ValueError):
        RepairSchedule(run, interval_s=0)
