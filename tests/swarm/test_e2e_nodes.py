"""Four node processes over loopback: replicated upload, download with nodes down, corruption, auth.

The steps share one cluster and run in order (one test per step of the story).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
import requests
from blake3 import blake3

from backend.peers.signing import RequestSigner
from backend.swarm.placement import overlay_address, xor_distance
from backend.swarm.reference import is_valid_chunk
from devnet.process import NodeProcess, prepare_nodes, start_all, stop_all
from tests.swarm.helpers import operator_token

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BLOB_MB = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("swarm-nodes")
    nodes = [NodeProcess(base / name) for name in "ABCD"]
    nodes[0].migrate()
    token = operator_token(nodes[0])  # blob writes are for operators
    prepare_nodes(nodes, replication=3)
    start_all(nodes)
    tokens = {n.address: token for n in nodes}
    blob = base / "blob.bin"
    with open(blob, "wb") as f:
        for _ in range(BLOB_MB):
            f.write(os.urandom(1 << 20))
    state = {"nodes": nodes, "tokens": tokens, "blob": blob, "digest": _sha256(blob)}
    yield state
    stop_all(nodes)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _auth(cluster, node: NodeProcess) -> dict[str, str]:
    return {"Authorization": f"Token {cluster['tokens'][node.address]}"}


def _download(cluster, node: NodeProcess, reference: str, out: Path) -> str:
    url = f"{node.url}/api/swarm/blobs/{reference}"
    with requests.get(url, headers=_auth(cluster, node), stream=True, timeout=120) as response:
        response.raise_for_status()
        with open(out, "wb") as f:
            for block in response.iter_content(1 << 20):
                f.write(block)
    return _sha256(out)


def _chunk_files(node: NodeProcess) -> list[Path]:
    return [p for p in node.chunk_dir.glob("??/*") if len(p.name) == 64]


def test_upload_at_a_replicates_every_chunk_three_times(cluster, tmp_path):
    a = cluster["nodes"][0]
    with open(cluster["blob"], "rb") as f:
        response = requests.post(
            f"{a.url}/api/swarm/blobs",
            data=f,
            headers={**_auth(cluster, a), "Content-Type": "application/octet-stream"},
            timeout=120,
        )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["size"] == BLOB_MB << 20 and not body["encrypted"]
    cluster["ref"] = body["reference"]
    counts = [len(_chunk_files(n)) for n in cluster["nodes"]]
    chunks = BLOB_MB + 1  # 50 leaves of 1 MiB and the root
    assert sum(counts) == 3 * chunks
    stat = requests.get(
        f"{a.url}/api/swarm/blobs/{body['reference']}/stat", headers=_auth(cluster, a), timeout=30
    )
    assert stat.json()["chunks"] == chunks


def test_download_at_d_is_byte_identical(cluster, tmp_path):
    d = cluster["nodes"][3]
    assert _download(cluster, d, cluster["ref"], tmp_path / "out.bin") == cluster["digest"]


def test_download_with_the_two_biggest_holders_stopped(cluster, tmp_path):
    nodes = cluster["nodes"]
    by_size = sorted(nodes, key=lambda n: len(_chunk_files(n)), reverse=True)
    stopped = by_size[:2]
    for node in stopped:
        node.kill()
    survivors = [n for n in nodes if n not in stopped]
    cluster["reader"], cluster["victim"] = survivors[-1], survivors[0]
    try:
        assert (
            _download(cluster, cluster["reader"], cluster["ref"], tmp_path / "out.bin") == cluster["digest"]
        )
    finally:
        start_all(stopped)


def test_corruption_is_detected_and_repaired_on_read(cluster, tmp_path):
    nodes, reader, victim = cluster["nodes"], cluster["reader"], cluster["victim"]
    overlays = {n.address: overlay_address(n.address) for n in nodes}

    def closest(address: bytes) -> str:
        return min(overlays, key=lambda a: xor_distance(address, overlays[a]))

    flipped = []
    for path in _chunk_files(victim):
        address = bytes.fromhex(path.name)
        if closest(address) == victim.address:  # the reader asks the victim first
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            path.write_bytes(bytes(raw))
            flipped.append(path)
    assert flipped
    assert _download(cluster, reader, cluster["ref"], tmp_path / "out.bin") == cluster["digest"]
    quarantined = list((victim.chunk_dir / "corrupt").iterdir())
    assert len(quarantined) == len(flipped)  # every flipped copy was detected on read...
    for path in flipped:  # ...and a good copy was pushed back to the victim
        assert is_valid_chunk(bytes.fromhex(path.name), path.read_bytes())


def test_encrypted_blob_round_trip_and_nodes_see_only_ciphertext(cluster, tmp_path):
    b, c = cluster["nodes"][1], cluster["nodes"][2]
    marker = b"TOP-SECRET-TRAINING-DATA-" * 40
    data = marker * ((3 << 20) // len(marker))
    response = requests.post(
        f"{b.url}/api/swarm/blobs?encrypt=1",
        data=data,
        headers={**_auth(cluster, b), "Content-Type": "application/octet-stream"},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    reference = response.json()["reference"]
    assert len(reference) == 128
    assert _download(cluster, c, reference, tmp_path / "enc.bin") == hashlib.sha256(data).hexdigest()
    for node in cluster["nodes"]:
        for path in _chunk_files(node):
            assert marker[:32] not in path.read_bytes()


def test_management_commands_put_get_stat_repair(cluster, tmp_path):
    b, c = cluster["nodes"][1], cluster["nodes"][2]
    src, out = tmp_path / "small.bin", tmp_path / "small.out"
    src.write_bytes(os.urandom(3 << 20))
    reference = b.manage("swarm", "put", str(src), "--encrypt").stdout.strip().splitlines()[-1]
    assert len(reference) == 128
    c.manage("swarm", "get", reference, str(out))
    assert out.read_bytes() == src.read_bytes()
    usage = json.loads(c.manage("swarm", "stat").stdout)["usage"]
    assert usage["chunks"] > 0 and usage["bytes"] > 0
    report = json.loads(c.manage("swarm", "repair").stdout.strip().splitlines()[-1])
    assert report["lost"] == 0


def test_repair_scrubs_other_nodes_and_replaces_their_corrupt_copies(cluster):
    b, c = cluster["nodes"][1], cluster["nodes"][2]
    leaves = set()
    with open(cluster["blob"], "rb") as f:
        while piece := f.read(1 << 20):
            leaves.add(blake3(struct.pack("<Q", len(piece)) + piece).hexdigest())
    flipped = [p for p in _chunk_files(b) if p.name in leaves][:5]
    assert flipped
    for path in flipped:
        raw = bytearray(path.read_bytes())
        raw[7] ^= 0xFF
        path.write_bytes(bytes(raw))
    report = json.loads(c.manage("swarm", "repair", cluster["ref"]).stdout.strip().splitlines()[-1])
    # B's own reads quarantine a corrupt copy too (a peer's fetch may reach it first under
    # load): then C's scrub finds it missing rather than corrupt. Either way every flipped
    # copy is replaced.
    assert 1 <= report["corrupt_copies"] <= len(flipped) and report["copies_added"] == len(flipped)
    for path in flipped:  # B re-hashed its copies when C asked, and got good ones back
        assert is_valid_chunk(bytes.fromhex(path.name), path.read_bytes())


def test_unsigned_unregistered_and_replayed_peer_requests_are_refused(cluster):
    a, b = cluster["nodes"][0], cluster["nodes"][1]
    url = f"{a.url}/api/swarm/peer/has"
    path = "/api/swarm/peer/has"
    body = bytes(32)

    unsigned = requests.post(url, data=body, timeout=10)
    assert unsigned.status_code == 401

    stranger = RequestSigner(os.urandom(32))
    unregistered = requests.post(
        url, data=body, headers=stranger.headers("POST", path, body, receiver=a.address), timeout=10
    )
    assert unregistered.status_code == 403

    headers = RequestSigner(bytes.fromhex(b.private_key.removeprefix("0x"))).headers(
        "POST", path, body, receiver=a.address
    )
    assert requests.post(url, data=body, headers=headers, timeout=10).status_code == 200
    replayed = requests.post(url, data=body, headers=headers, timeout=10)
    assert replayed.status_code == 401 and "replayed" in replayed.json()["detail"]

    # The user API is not open either.
    assert requests.get(f"{a.url}/api/swarm/stat", timeout=10).status_code in (401, 403)
