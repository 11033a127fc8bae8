"""A hostile REST client against a real node: two gunicorn processes sharing one node's database.

The victim node is deliberately misconfigured in ways that produce errors with secrets in
them (no usable key, a keystore path, a chain RPC URL that does not answer, a peer URL), so
that every error path has something to leak. Each test names the attack class it covers.
"""

from __future__ import annotations

import http.client
import os
import secrets
from pathlib import Path

import pytest
import requests

from devnet.anvil import free_port
from devnet.process import NodeProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USERS = {"operator": "op-pass-123456", "provider": "prov-pass-123456", "viewer": "view-pass-123456"}
LOCKOUT_FAILURES = 4
LOCKOUT_S = 900


@pytest.fixture(scope="module")
def victim(tmp_path_factory):
    """One node, two web processes (A and B) on one database and cache; tokens for each role."""
    data_dir = tmp_path_factory.mktemp("victim")
    hidden = data_dir / "hidden-keystore-dir"
    dead_port = free_port()
    env = {
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DEFL_NODE_KEY": "",  # no key: everything that needs one fails, naming the keystore path
        "DEFL_KEYSTORE_PATH": str(hidden / "keystore.json"),
        "DEFL_CHAIN_URL": f"http://127.0.0.1:{dead_port}/secret-rpc-path",
        "DEFL_PEERS": "0x" + "11" * 20 + "@http://10.255.0.1:9/secret-peer-path",
        "DEFL_LOGIN_LOCKOUT_FAILURES": str(LOCKOUT_FAILURES),
        "DEFL_LOGIN_LOCKOUT_S": str(LOCKOUT_S),
        "TMPDIR": str(data_dir / "tmp"),  # where Django would spool an upload
    }
    (data_dir / "tmp").mkdir()
    first = NodeProcess(data_dir, env=env, threads=4)
    second = NodeProcess(data_dir, env=env, threads=4, private_key=first.private_key)
    first.migrate()
    code = "from backend.nodes.accounts import api_token, create_or_update_user\n" + "".join(
        f"print('{role}', api_token(create_or_update_user('{role}', '{role}', '{password}')[0]))\n"
        for role, password in USERS.items()
    )
    lines = first.manage("shell", "-c", code).stdout.split("\n")
    tokens = dict(line.split() for line in lines if line.split() and line.split()[0] in USERS)
    first.start(wait=False)
    second.start(wait=False)
    try:
        first.wait_ready(120)
        second.wait_ready(120)
        yield {
            "nodes": (first, second),
            "tokens": tokens,
            "data_dir": data_dir,
            "secrets": _secrets(env, data_dir),
        }
    finally:
        first.stop()
        second.stop()


def _secrets(env: dict, data_dir: Path) -> list[str]:
    return [
        "secret-rpc-path",
        "secret-peer-path",
        "10.255.0.1",
        "hidden-keystore-dir",
        str(data_dir),
        "Traceback",
        "SELECT ",
        env["DJANGO_SECRET_KEY"],
    ]


def _session(token: str | None = None) -> requests.Session:
    session = requests.Session()
    if token:
        session.headers["Authorization"] = f"Token {token}"
    return session


def _assert_no_leak(response: requests.Response, leaks: list[str]) -> None:
    body = response.text
    for leak in leaks:
        assert leak not in body, f"{response.request.method} {response.url} leaks {leak!r}: {body[:300]}"


def test_error_bodies_leak_no_path_peer_rpc_or_traceback_to_any_role(victim):
    """Attack class: information disclosure through error messages (reconnaissance of paths, peers, RPC)."""
    first, second = victim["nodes"]
    probes = [
        ("get", "/api/node", None),
        ("get", "/api/peers", None),
        ("get", "/api/events", None),
        ("get", "/api/jobs", None),
        ("get", "/api/jobs/1", None),
        ("get", "/api/jobs/340282366920938463463374607431768211456", None),
        ("get", "/api/jobs/1/rounds", None),
        ("get", "/api/datasets/999999", None),
        ("get", "/api/models", None),
        ("get", "/api/swarm/stat", None),
        ("get", "/api/swarm/blobs/" + "ab" * 32, None),
        ("get", "/api/swarm/blobs/..%2F..%2Fetc%2Fpasswd", None),
        ("post", "/api/jobs", {"json": {"name": "x", "dataset": 1}}),
        ("post", "/api/jobs/1/join", {"json": {"dataset": 1}}),
        ("post", "/api/datasets", {"data": b"not a multipart body"}),
        ("post", "/api/jobs", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}),
    ]
    seen_statuses = set()
    for role, token in victim["tokens"].items():
        client = _session(token)
        for node in (first, second):
            for method, path, kwargs in probes:
                response = client.request(method, node.url + path, timeout=60, **(kwargs or {}))
                seen_statuses.add(response.status_code)
                _assert_no_leak(response, victim["secrets"])
                if response.status_code >= 400 and response.headers.get("Content-Type", "").startswith(
                    "application/json"
                ):
                    assert response.json().get("detail"), f"{role} {path}: an error without a sentence"
    assert any(code >= 500 for code in seen_statuses) or 409 in seen_statuses  # the errors were provoked
    assert requests.get(first.url + "/api/health", timeout=10).status_code == 200


def test_a_viewer_cannot_write_anything(victim):
    """Attack class: privilege escalation by a logged-in read-only user (writes through every family)."""
    first, _ = victim["nodes"]
    viewer = _session(victim["tokens"]["viewer"])
    writes = [
        ("post", "/api/jobs", {"json": {"name": "x"}}),
        ("post", "/api/jobs/1/join", {"json": {"dataset": 1}}),
        ("post", "/api/jobs/1/start", None),
        ("post", "/api/jobs/1/cancel", None),
        ("post", "/api/datasets", {"files": {"file": ("d.csv", b"a,b\n1,2\n")}, "data": {"name": "d"}}),
        ("post", "/api/datasets/1/grants", {"json": {"grantee": "0x" + "22" * 20}}),
        ("post", "/api/swarm/blobs?pin=1", {"files": {"file": ("b.bin", b"x" * 1000)}}),
        (
            "post",
            "/api/swarm/blobs",
            {"data": b"x" * 1000, "headers": {"Content-Type": "application/octet-stream"}},
        ),
    ]
    for method, path, kwargs in writes:
        response = viewer.request(method, first.url + path, timeout=60, **(kwargs or {}))
        assert response.status_code == 403, (
            f"viewer {method} {path}: {response.status_code} {response.text[:200]}"
        )
        assert "your role does not allow this request" in response.json()["detail"]
    assert viewer.get(first.url + "/api/datasets", timeout=30).json()["count"] == 0


def test_an_expired_token_is_refused_by_every_process(victim):
    """Attack class: replay of a stolen, old API token."""
    first, second = victim["nodes"]
    for name, node in (("stale-a", first), ("stale-b", second)):  # one token each: a refusal deletes it
        code = (
            "from datetime import timedelta; from django.utils import timezone; "
            "from backend.nodes.models import ApiToken; from backend.nodes.tokens import digest; "
            "from backend.nodes.accounts import api_token, create_or_update_user; "
            f"u, _ = create_or_update_user('{name}', 'operator', 'stale-pass-123456'); key = api_token(u); "
            "ApiToken.objects.filter(digest=digest(key)).update(expires=timezone.now() - timedelta(days=2)); print(key)"
        )
        stale = first.manage("shell", "-c", code).stdout.split()[-1]
        response = _session(stale).get(node.url + "/api/auth/me", timeout=30)
        assert response.status_code == 401
        assert "the token has expired" in response.json()["detail"]
        assert _session(stale).get(first.url + "/api/auth/me", timeout=30).status_code == 401  # stays dead
    # The honest operator's fresh token still works.
    assert (
        _session(victim["tokens"]["operator"]).get(first.url + "/api/auth/me", timeout=30).status_code == 200
    )


def test_a_cross_site_write_with_the_session_cookie_alone_is_refused(victim):
    """Attack class: cross-site request forgery (a page the operator visits posts with their cookie)."""
    first, second = victim["nodes"]
    # Its own account, as before: a logout now ends only this login, never another's token.
    create = "from backend.nodes.accounts import create_or_update_user as c; c('csrf-op', 'operator', 'csrf-pass-1234')"
    first.manage("shell", "-c", create)
    browser = requests.Session()
    login = browser.post(
        first.url + "/api/auth/login", json={"username": "csrf-op", "password": "csrf-pass-1234"}, timeout=30
    )
    assert login.status_code == 200
    assert browser.get(second.url + "/api/auth/me", timeout=30).json()["role"] == "operator"  # one session
    forged = browser.post(first.url + "/api/auth/logout", timeout=30)  # no X-CSRFToken header
    assert forged.status_code == 403
    assert "CSRF" in forged.json()["detail"]
    assert browser.get(first.url + "/api/auth/me", timeout=30).status_code == 200  # still signed in
    csrf = browser.cookies["csrftoken"]
    honest = browser.post(first.url + "/api/auth/logout", headers={"X-CSRFToken": csrf}, timeout=30)
    assert honest.status_code == 204


def test_anonymous_and_provider_callers_cannot_reach_operator_writes(victim):
    """Attack class: missing authentication and horizontal privilege escalation."""
    first, _ = victim["nodes"]
    provider = _session(victim["tokens"]["provider"])
    for path in ("/api/jobs", "/api/jobs/1/start", "/api/jobs/1/cancel", "/api/swarm/blobs"):
        anonymous = requests.post(first.url + path, json={}, timeout=30)
        assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == "Token"
        assert provider.post(first.url + path, json={}, timeout=30).status_code == 403


def test_brute_force_login_across_processes_is_locked_out(victim):
    """Attack class: online password guessing (brute force), spread over a node's web processes."""
    first, second = victim["nodes"]
    guesses = [f"guess-{i}" for i in range(LOCKOUT_FAILURES)]
    for i, guess in enumerate(guesses):  # alternate processes: the count is shared
        node = (first, second)[i % 2]
        response = requests.post(
            node.url + "/api/auth/login", json={"username": "operator", "password": guess}, timeout=30
        )
        assert response.status_code == 401
    for node in (first, second):
        locked = requests.post(
            node.url + "/api/auth/login",
            json={"username": "operator", "password": USERS["operator"]},
            headers={"X-Forwarded-For": "198.51.100.7"},  # a forged address changes nothing
            timeout=30,
        )
        assert locked.status_code == 429
        assert 0 < int(locked.headers["Retry-After"]) <= LOCKOUT_S
        assert "too many failed logins" in locked.json()["detail"]
    # The node keeps serving everyone else: token clients are not affected by the lockout.
    for role, token in victim["tokens"].items():
        assert _session(token).get(second.url + "/api/auth/me", timeout=30).json()["role"] == role


def test_a_large_multipart_upload_never_reaches_the_temp_directory(victim):
    """Attack class: data at rest in the clear (an upload spooled to a plaintext temp file, where a
    crash, a backup or another local user finds it)."""
    first, _ = victim["nodes"]
    temp_dir = victim["data_dir"] / "tmp"
    boundary = "defl-upload-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    payload = b"plaintext!" * (800 * 1024)  # 8 MB, far above Django's 2.5 MB spooling threshold
    connection = http.client.HTTPConnection("127.0.0.1", first.port, timeout=120)
    connection.putrequest("POST", "/api/swarm/blobs")
    connection.putheader("Authorization", f"Token {victim['tokens']['operator']}")
    connection.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    connection.putheader("Content-Length", str(len(head) + len(payload) + len(tail)))
    connection.endheaders()
    connection.send(head)
    seen = []
    step = 512 * 1024
    for offset in range(0, len(payload), step):
        connection.send(payload[offset : offset + step])
        seen.extend(os.listdir(temp_dir))  # while the node is reading the body
    connection.send(tail)
    response = connection.getresponse()
    body = response.read().decode()
    connection.close()
    assert seen == [], f"the upload was spooled to {seen}"
    assert os.listdir(temp_dir) == []
    assert response.status != 403, body  # it was read, as an operator's upload
    for leak in victim["secrets"]:
        assert leak not in body
