"""A hostile member and a hostile outsider against the swarm store of real node processes.

Three gunicorn nodes (A, B, C) on loopback form the store; B turns hostile: it signs with
its own, registered key. The outsider has a key no registry lists. Each test names the
class of attack it covers in its docstring; the honest nodes keep serving after each.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from pathlib import Path

import pytest
import requests
from eth_account import Account

from backend.peers.endpoints import EndpointGuard, EndpointRefused
from backend.peers.signing import RequestSigner
from backend.swarm.client import FETCH_PATH, HAS_PATH, PUSH_PATH, PeerClient
from backend.swarm.errors import PeerError
from backend.swarm.reference import chunk_address, encode_span
from backend.swarm.registry import LedgerPeerDirectory
from backend.swarm.wire import batch_digest, decode_addresses, encode_batch
from devnet.process import NodeProcess, prepare_nodes, start_all, stop_all
from tests.swarm.helpers import operator_token

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MiB = 1 << 20
BRANCHES = MiB // 32  # references in one 1 MiB intermediate chunk
BODY_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-swarm")
    env = {"MALLOC_ARENA_MAX": "2"}  # the victim's memory-limited read: few malloc arenas
    nodes = [NodeProcess(base / name, env=env, threads=4) for name in "ABC"]
    nodes[0].migrate()
    token = operator_token(nodes[0])
    prepare_nodes(nodes, replication=3, swarm_fsync=0, swarm_body_timeout_s=BODY_TIMEOUT_S)
    start_all(nodes, wait_s=120)
    yield {"nodes": nodes, "token": token, "base": base}
    stop_all(nodes)


def _signer(node: NodeProcess) -> RequestSigner:
    return RequestSigner(bytes.fromhex(node.private_key.removeprefix("0x")))


def _post(sender: RequestSigner, node: NodeProcess, path: str, body: bytes, digest: str | None = None):
    headers = sender.headers("POST", path, body, receiver=node.address, digest=digest)
    return requests.post(node.url + path, data=body, headers=headers, timeout=60)


def _push(sender: RequestSigner, node: NodeProcess, chunks: list[tuple[bytes, bytes]]) -> set[bytes]:
    body = encode_batch(chunks)
    response = _post(sender, node, PUSH_PATH, body, batch_digest(body))
    assert response.status_code == 200, response.text
    return set(decode_addresses(response.content))


class _Declared:
    """A body of which only the length exists: signed (with a given digest), never sent."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def _chunk(span: int, payload: bytes) -> tuple[bytes, bytes]:
    data = encode_span(span) + payload
    return chunk_address(data), data


def _healthy(node: NodeProcess, sender: RequestSigner) -> bool:
    return _post(sender, node, HAS_PATH, bytes(32)).status_code == 200


def _raw_request(
    node: NodeProcess, path: str, headers: dict[str, str], length: int, body: bytes = b"", until: bytes = b""
) -> bytes:
    """Send a request's head (and ``body``, maybe less than ``length``); return what the server sent
    until it closed the connection (or, with ``until``, until that appears)."""
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{node.port}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection(("127.0.0.1", node.port), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        received = b""
        while chunk := sock.recv(65536):  # until the server closes the connection
            received += chunk
            if until and until in received:
                break
    return received


# --------------------------------------------------------------------------- chunk-tree bombs

VICTIM_READ = """
import json, resource
from types import SimpleNamespace
from backend.jobs import blobs, discovery
from backend.jobs.driver.memory import DriverMemory
from backend.ledger import models as mirror
from backend.swarm.factory import node_swarm

ctx = SimpleNamespace(swarm=node_swarm(), memory=DriverMemory())
cases = json.loads({cases!r})

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

limit = vm_bytes() + (1 << 30)  # everything is imported: 1 GiB more, a 32 GiB blob cannot fit
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
outcome = {{}}
for name, reference, bound in cases:
    try:
        if bound is None:  # the agent's discovery of a job whose config hash is the bomb
            discovery.discover(ctx, mirror.Job(job_id=7, config_hash=reference))
        else:  # an update reference, read with the bound of its model's spec
            blobs.get(ctx, reference, max_bytes=bound)
        outcome[name] = "accepted"
    except MemoryError:
        outcome[name] = "MemoryError"
    except Exception as exc:
        outcome[name] = type(exc).__name__
print("OUTCOME " + json.dumps(outcome))
"""


def test_span_bombs_as_config_and_update_references_are_refused_with_bounded_memory(cluster):
    """Attack: resource exhaustion through a chunk-tree bomb (hostile member).

    B stores, on every node, chunk trees that expand to terabytes from a few MiB: an honest
    1 TiB root that lists one 32 GiB subtree 32768 times (each subtree lists one 1 MiB leaf
    32768 times), a root that claims 100 bytes but lists 32 GiB of leaves, and a root that
    claims 3 MiB but repeats one leaf 32768 times. B proposes them as a job's config and
    as updates. The victim reads them as its agent would, under a memory limit of 1 GiB
    over what it has loaded: every one is refused (too large, or a malformed tree)
    without running out of memory, and the victim keeps serving.
    """
    a, b, c = cluster["nodes"]
    hostile = _signer(b)
    leaf_address, leaf = _chunk(MiB, b"A" * MiB)
    inner_address, inner = _chunk(BRANCHES * MiB, leaf_address * BRANCHES)
    huge_address, huge = _chunk(BRANCHES * BRANCHES * MiB, inner_address * BRANCHES)
    liar_address, liar = _chunk(100, leaf_address * BRANCHES)
    wide_address, wide = _chunk(3 * MiB, leaf_address * BRANCHES)
    chunks = [
        (leaf_address, leaf),
        (inner_address, inner),
        (huge_address, huge),
        (liar_address, liar),
        (wide_address, wide),
    ]
    for node in (a, b, c):
        assert _push(hostile, node, chunks) == {address for address, _ in chunks}

    cases = [
        ("config_1tib", huge_address.hex(), None),
        ("config_lying_span", liar_address.hex(), None),
        ("update_1tib", huge_address.hex(), 8 * MiB),
        ("update_lying_span", liar_address.hex(), 8 * MiB),
        ("update_repeated_leaf", wide_address.hex(), 8 * MiB),
    ]
    code = VICTIM_READ.format(cases=json.dumps(cases))
    result = a.manage("shell", "-c", code, check=False, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, result.stdout + result.stderr
    outcome = json.loads(lines[-1].removeprefix("OUTCOME "))
    assert outcome == {
        "config_1tib": "BlobTooLarge",
        "config_lying_span": "InvalidTree",
        "update_1tib": "BlobTooLarge",
        "update_lying_span": "InvalidTree",
        "update_repeated_leaf": "InvalidTree",
    }
    assert _healthy(a, _signer(c))


def test_a_peer_cannot_park_an_oversized_chunk(cluster):
    """Attack: storage abuse through oversized chunks (hostile member).

    A chunk larger than the chunk size cannot belong to any blob; a node does not store it
    (the joiner would refuse it anyway), so a member cannot park blobs of any size.
    """
    a, b, _ = cluster["nodes"]
    big_address, big = _chunk(2 * MiB, os.urandom(2 * MiB))
    small_address, small = _chunk(10, b"0123456789")
    assert _push(_signer(b), a, [(big_address, big), (small_address, small)]) == {small_address}


# --------------------------------------------------------------------------- peer API bodies


def test_oversized_body_from_a_non_member_is_refused_before_the_body_is_read(cluster):
    """Attack: memory and bandwidth exhaustion by a large body (hostile outsider).

    The outsider signs a push with an unregistered key and declares a 60 MiB body, then
    sends none of it. The node answers from the headers alone (0 body bytes read; it
    cannot have read bytes that were never sent) and closes the connection instead of
    waiting for the body.
    """
    a = cluster["nodes"][0]
    outsider = RequestSigner(os.urandom(32))
    length = 60 * MiB
    headers = outsider.headers("POST", PUSH_PATH, _Declared(length), receiver=a.address, digest="00" * 32)
    answer = _raw_request(a, PUSH_PATH, headers, length)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"not a registered node" in answer
    unsigned = _raw_request(a, PUSH_PATH, {}, length)
    assert unsigned.startswith(b"HTTP/1.1 401"), unsigned[:200]


def test_oversized_body_from_a_member_is_refused_before_the_body_is_read(cluster):
    """Attack: memory exhaustion by a large body (hostile member, validly signed).

    A member declares a push body over the node's cap (64 MiB), and a fetch body larger
    than 64 addresses: both are refused with 413 from the headers, 0 body bytes read.
    """
    a, b, _ = cluster["nodes"]
    hostile = _signer(b)
    for path, length in ((PUSH_PATH, 200 * MiB), (FETCH_PATH, 65 * 32)):
        headers = hostile.headers("POST", path, _Declared(length), receiver=a.address, digest="00" * 32)
        answer = _raw_request(a, path, headers, length)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert _healthy(a, _signer(b))


def test_a_slow_body_is_cut_off_and_does_not_hold_the_nodes_threads(cluster):
    """Attack: slow-loris on the peer API (hostile member).

    B opens as many connections as A has threads, each with valid headers and a 256 KiB
    body of which it sends 10 bytes, then nothing. A gives each body a deadline (here
    2 s plus 1 s per MB), answers 408 and closes, so an honest peer's request made
    meanwhile is served once those threads are free instead of waiting forever.
    """
    a, b, c = cluster["nodes"]
    hostile = _signer(b)
    sockets = []
    for _ in range(4):  # A runs 4 threads
        body = bytes(256 << 10)  # 8192 addresses, within what ``has`` accepts
        headers = hostile.headers("POST", HAS_PATH, body, receiver=a.address)
        sock = socket.create_connection(("127.0.0.1", a.port), timeout=60)
        head = [f"POST {HAS_PATH} HTTP/1.1", f"Host: 127.0.0.1:{a.port}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body[:10])
        sockets.append(sock)
    try:
        assert _healthy(a, _signer(c))  # served once a slow body's deadline has passed
        for sock in sockets:
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            assert received.startswith(b"HTTP/1.1 408"), received[:200]
    finally:
        for sock in sockets:
            sock.close()


# --------------------------------------------------------------------------- replays


def test_a_request_replayed_to_another_node_is_refused(cluster):
    """Attack: cross-node replay (hostile member or an eavesdropper).

    A request B signed for A, captured and sent to C, names the wrong receiver; rewriting
    the receiver header breaks the signature.
    """
    a, b, c = cluster["nodes"]
    body = bytes(32)
    headers = _signer(b).headers("POST", HAS_PATH, body, receiver=a.address)
    replayed = requests.post(c.url + HAS_PATH, data=body, headers=headers, timeout=30)
    assert replayed.status_code == 401 and "another node" in replayed.json()["detail"]
    headers["X-Swarm-Receiver"] = c.address
    rewritten = requests.post(c.url + HAS_PATH, data=body, headers=headers, timeout=30)
    assert rewritten.status_code == 401
    headers["X-Swarm-Receiver"] = a.address
    assert requests.post(a.url + HAS_PATH, data=body, headers=headers, timeout=30).status_code == 200


def test_a_request_replayed_to_another_process_of_the_same_node_is_refused(cluster):
    """Attack: replay across a node's processes (hostile member or an eavesdropper).

    A second server process of node A (as a second gunicorn worker, the agent or celery
    would be) shares A's database; the nonce A's first process accepted is refused there.
    """
    a, b, _ = cluster["nodes"]
    twin = NodeProcess(a.data_dir, private_key=a.private_key, env=dict(a.extra_env), threads=2)
    twin.start(wait_s=120)
    try:
        body = bytes(32)
        headers = _signer(b).headers("POST", HAS_PATH, body, receiver=a.address)
        assert requests.post(a.url + HAS_PATH, data=body, headers=headers, timeout=30).status_code == 200
        replayed = requests.post(twin.url + HAS_PATH, data=body, headers=headers, timeout=30)
        assert replayed.status_code == 401 and "replayed" in replayed.json()["detail"]
    finally:
        twin.stop()


# --------------------------------------------------------------------------- endpoints


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A peer that redirects every request, or answers with far more bytes than asked."""

    mode = "redirect"
    target = ""
    hits: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        type(self).hits.append(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if type(self).mode == "redirect":
            self.send_response(307)
            self.send_header("Location", type(self).target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()  # no Content-Length: the client only learns the size by reading
        try:
            for _ in range(256):
                self.wfile.write(bytes(MiB))
        except OSError:
            pass  # the client hung up once it had read its limit

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_peer():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorder.hits = []
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_redirecting_peer_is_not_followed(cluster, fake_peer):
    """Attack: request forgery through redirects (hostile member's endpoint).

    B's endpoint answers 307 towards another address (here node A's peer API, standing
    for an internal service). The client refuses the answer and sends nothing there.
    """
    a = cluster["nodes"][0]
    _, url = fake_peer
    _Recorder.mode, _Recorder.target = "redirect", a.url
    client = PeerClient(
        url, RequestSigner(os.urandom(32)), receiver=Account.create().address, allow_private=True
    )
    with pytest.raises(PeerError, match="HTTP 307"):
        client.has([bytes(32)])
    assert _Recorder.hits == [HAS_PATH]  # asked once; the redirect target was never requested
    client.close()


def test_a_peer_answering_without_end_is_cut_off_at_the_expected_size(fake_peer):
    """Attack: memory exhaustion through a peer's response (hostile member's endpoint).

    Asked whether it holds one chunk, the peer streams 256 MiB without a Content-Length.
    The client reads at most what the answer can be (32 bytes) and refuses the rest.
    """
    _, url = fake_peer
    _Recorder.mode = "flood"
    client = PeerClient(
        url, RequestSigner(os.urandom(32)), receiver=Account.create().address, allow_private=True
    )
    with pytest.raises(PeerError, match="larger than 32 bytes"):
        client.has([bytes(32)])
    client.close()


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:8000",
        "http://10.0.0.7",
        "http://172.16.3.4:80",
        "http://192.168.1.1",
        "http://169.254.169.254/latest/meta-data",  # cloud metadata
        "http://100.64.0.1",  # shared address space
        "http://[::1]:8000",
        "http://[fe80::1]",
        "http://[::ffff:127.0.0.1]",
        "http://0.0.0.0:8000",
        "ftp://93.184.216.34",
        "file:///etc/passwd",
        "http://user:secret@93.184.216.34",
    ],
)
def test_a_registered_endpoint_pointing_inward_is_not_dialled(endpoint):
    """Attack: server-side request forgery through a registered endpoint (hostile member).

    The member stays a member (its signed requests are verified as any other's) but this
    node never dials its endpoint, unless the node's configuration allows private peers.
    """
    good = Account.create().address
    bad = Account.create().address
    members = [(good, "http://93.184.216.34:8000"), (bad, endpoint)]
    directory = LedgerPeerDirectory(lambda: members)
    urls = {p.address: p.url for p in directory.peers()}
    assert urls[good] == "http://93.184.216.34:8000"
    assert urls[bad] == "" and directory.is_registered(bad)
    if endpoint.startswith("http://") and "@" not in endpoint:
        allowed = LedgerPeerDirectory(lambda: members, allow_private=True)
        assert {p.address: p.url for p in allowed.peers()}[bad] == endpoint.rstrip("/")


def test_a_host_name_that_resolves_inward_is_refused_when_dialled():
    """Attack: server-side request forgery through DNS (hostile member's endpoint).

    A name passes the registry's text check; its addresses are checked before each request.
    """
    guard = EndpointGuard("http://localhost:8000", allow_private=False)
    with pytest.raises(EndpointRefused, match="loopback"):
        guard.check()
    EndpointGuard("http://localhost:8000", allow_private=True).check()


# --------------------------------------------------------------------------- the blob API


def test_blob_writes_are_for_operators_within_the_quota(cluster, tmp_path):
    """Attack: storage abuse through the user API (a viewer or provider account, an operator's).

    Viewers and providers cannot upload; an operator's upload beyond the node's quota of
    pinned bytes is refused with a sentence before it is stored.
    """
    a = cluster["nodes"][0]
    tokens = {}
    for role in ("viewer", "provider"):
        tokens[role] = operator_token(a, username=f"hostile-{role}", role=role)
    for role, token in tokens.items():
        response = requests.post(
            f"{a.url}/api/swarm/blobs",
            data=b"x" * 1000,
            headers={"Authorization": f"Token {token}", "Content-Type": "application/octet-stream"},
            timeout=30,
        )
        assert response.status_code == 403, (role, response.text)
        assert requests.get(
            f"{a.url}/api/swarm/stat", headers={"Authorization": f"Token {token}"}, timeout=30
        ).ok
    # 20 GiB declared, none sent: refused from the headers, nothing stored.
    headers = {"Authorization": f"Token {cluster['token']}", "Content-Type": "application/octet-stream"}
    answer = _raw_request(a, "/api/swarm/blobs", headers, 20 << 30, until=b"}")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"quota" in answer


def test_the_store_still_works_after_the_attacks(cluster, tmp_path):
    """The honest path after everything above: an operator's upload replicates and reads back."""
    a, _, c = cluster["nodes"]
    data = os.urandom(3 * MiB + 5)
    auth = {"Authorization": f"Token {cluster['token']}"}
    response = requests.post(
        f"{a.url}/api/swarm/blobs",
        data=data,
        headers={**auth, "Content-Type": "application/octet-stream"},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    reference = response.json()["reference"]
    back = requests.get(f"{c.url}/api/swarm/blobs/{reference}", headers=auth, timeout=60)
    assert back.status_code == 200 and back.content == data
    Path(tmp_path / "ok").write_text("ok")
