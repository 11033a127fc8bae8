"""The hardened API: a secret key whenever DEBUG is off, login throttles and lockout, tokens that
expire, error bodies that name nothing internal, uploads that never touch a temp file."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.urls import path
from django.utils import timezone
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.test import APIClient
from rest_framework.views import APIView

from backend.api import throttling
from backend.api.exception_handler import scrub
from backend.api.permissions import AnyRole
from backend.api.uploads import BoundedMemoryUploadHandler, UploadTooLarge
from backend.identity.roles import Role
from backend.nodes.accounts import api_token, create_or_update_user
from backend.nodes.models import ApiToken
from backend.nodes.tokens import digest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


# ----------------------------------------------------------------------------- secret key


def _import_settings(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DEFL_"))}
    return subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(len(settings.SECRET_KEY))"],
        cwd=ROOT,
        env=base
        | {"DJANGO_SETTINGS_MODULE": "backend.settings", "DEFL_DATA_DIR": "/tmp/defl-secret-test"}
        | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_node_without_secret_key_and_debug_off_refuses_to_start_with_one_sentence():
    result = _import_settings()
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is not set: a node with DJANGO_DEBUG off refuses to start" in result.stderr


@pytest.mark.parametrize(
    "env",
    [{"DJANGO_SECRET_KEY": "k" * 50}, {"DJANGO_DEBUG": "1"}, {"DEFL_ALLOW_INSECURE_SECRET": "1"}],
)
def test_a_secret_debug_or_an_explicit_opt_in_lets_it_start(env):
    result = _import_settings(**env)
    assert result.returncode == 0, result.stderr


def test_the_commands_help_needs_no_secret(tmp_path):
    """`manage.py node adduser --help` on a node not configured yet prints its usage; a real command
    without the secret is still refused."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DEFL_"))}
    env = base | {"DEFL_DATA_DIR": str(tmp_path)}
    helped = subprocess.run(
        [sys.executable, "manage.py", "node", "adduser", "--help"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert "usage: manage.py node adduser" in helped.stdout and "--role" in helped.stdout
    refused = subprocess.run(
        [sys.executable, "manage.py", "node", "adduser", "ada", "--role", "operator"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode != 0 and "DJANGO_SECRET_KEY is not set" in refused.stderr


def test_node_processes_get_their_own_random_secret(tmp_path):
    from devnet.process import NodeProcess

    first, second = NodeProcess(tmp_path / "a", port=1), NodeProcess(tmp_path / "b", port=2)
    assert len(first.environ()["DJANGO_SECRET_KEY"]) >= 50
    assert first.environ()["DJANGO_SECRET_KEY"] == first.environ()["DJANGO_SECRET_KEY"]  # all its processes
    assert first.environ()["DJANGO_SECRET_KEY"] != second.environ()["DJANGO_SECRET_KEY"]


# ----------------------------------------------------------------------------- login throttle, lockout


def _login(client: APIClient, username: str, password: str, **extra):
    return client.post(
        "/api/auth/login", {"username": username, "password": password}, format="json", **extra
    )


@pytest.fixture
def lockout(settings):
    settings.DEFL_LOGIN_LOCKOUT_FAILURES = 3
    settings.DEFL_LOGIN_LOCKOUT_S = 600
    return settings


def test_repeated_failures_lock_the_account_with_429_retry_after_and_a_sentence(lockout, monkeypatch):
    create_or_update_user("ada", Role.OPERATOR, password="s3cret-pass")
    client = APIClient()
    for _ in range(3):
        assert _login(client, "ada", "guess").status_code == 401
    locked = _login(client, "ada", "s3cret-pass")  # even the right password, while locked
    assert locked.status_code == 429
    assert 0 < int(locked["Retry-After"]) <= 600
    # One sentence, with the wait as a person reads it (DRF used to append a second one).
    assert locked.json()["detail"] == (
        "too many failed logins for this account or from this address: try again in 10 minutes"
    )
    # Another address, same account: still locked (a guesser cannot rotate addresses).
    other = _login(APIClient(), "ada", "s3cret-pass", REMOTE_ADDR="10.9.8.7")
    assert other.status_code == 429
    # Once the lock has passed, the right password works and clears the count.
    later = throttling.time.time() + 601
    monkeypatch.setattr(throttling.time, "time", lambda: later)
    assert _login(client, "ada", "s3cret-pass", REMOTE_ADDR="10.9.8.7").status_code == 200


def test_one_address_guessing_many_usernames_is_locked_out(lockout):
    create_or_update_user("bob", Role.VIEWER, password="s3cret-pass")
    client = APIClient()
    for name in ("u1", "u2", "u3"):
        assert _login(client, name, "guess").status_code == 401
    assert _login(client, "bob", "s3cret-pass").status_code == 429
    assert _login(client, "bob", "s3cret-pass", REMOTE_ADDR="10.1.1.1").status_code == 200


def test_a_success_resets_the_failure_count(lockout):
    create_or_update_user("cy", Role.VIEWER, password="s3cret-pass")
    client = APIClient()
    for _ in range(2):
        assert _login(client, "cy", "guess").status_code == 401
    assert _login(client, "cy", "s3cret-pass").status_code == 200
    for _ in range(2):
        assert _login(client, "cy", "guess").status_code == 401
    assert _login(client, "cy", "s3cret-pass").status_code == 200


def test_per_username_rate_throttles_before_any_lockout(settings, monkeypatch):
    settings.DEFL_LOGIN_LOCKOUT_FAILURES = 1000
    monkeypatch.setattr(throttling.LoginUsernameThrottle, "THROTTLE_RATES", {"login_user": "3/min"})
    create_or_update_user("dee", Role.VIEWER, password="s3cret-pass")
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert _login(APIClient(), "dee", "guess", REMOTE_ADDR=address).status_code == 401
    throttled = _login(APIClient(), "dee", "s3cret-pass", REMOTE_ADDR="10.0.0.4")
    assert throttled.status_code == 429
    wait = int(throttled["Retry-After"])
    assert 0 < wait <= 60
    detail = throttled.json()["detail"]
    assert detail.startswith("too many login attempts for this account or from this address: try again in ")
    assert "Expected available" not in detail and detail.count(":") == 1


# ----------------------------------------------------------------------------- the admin's login


def _admin_login(client, username: str, password: str, **extra):
    return client.post("/admin/login/", {"username": username, "password": password}, **extra)


def test_the_admin_login_is_locked_out_like_the_api_login(lockout):
    from django.test import Client

    create_or_update_user("root", Role.OPERATOR, password="s3cret-pass")
    get_user_model().objects.filter(username="root").update(is_staff=True, is_superuser=True)
    client = Client()
    for _ in range(3):
        assert _admin_login(client, "root", "guess").status_code == 200  # the form again, with its error
    locked = _admin_login(client, "root", "s3cret-pass")
    assert locked.status_code == 429
    assert 0 < int(locked["Retry-After"]) <= 600
    assert b"too many failed logins" in locked.content
    # The API's login shares the count: the same account is locked there too.
    assert _login(APIClient(), "root", "s3cret-pass").status_code == 429


def test_the_admin_login_is_rate_throttled_and_a_success_still_works(settings, monkeypatch):
    from django.test import Client

    settings.DEFL_LOGIN_LOCKOUT_FAILURES = 1000
    create_or_update_user("boss", Role.OPERATOR, password="s3cret-pass")
    get_user_model().objects.filter(username="boss").update(is_staff=True)
    assert _admin_login(Client(), "boss", "s3cret-pass").status_code == 302  # signed in
    monkeypatch.setattr(throttling.LoginUsernameThrottle, "THROTTLE_RATES", {"login_user": "2/min"})
    for address in ("10.0.0.1", "10.0.0.2"):
        _admin_login(Client(), "boss", "guess", REMOTE_ADDR=address)
    assert _admin_login(Client(), "boss", "s3cret-pass", REMOTE_ADDR="10.0.0.3").status_code == 429


def test_a_forged_forwarded_for_header_does_not_escape_the_address_throttle(settings, monkeypatch):
    settings.DEFL_LOGIN_LOCKOUT_FAILURES = 1000
    monkeypatch.setattr(throttling.LoginAddressThrottle, "THROTTLE_RATES", {"login_ip": "2/min"})
    client = APIClient()
    for i in range(2):
        assert _login(client, f"x{i}", "guess", HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code == 401
    assert _login(client, "x9", "guess", HTTP_X_FORWARDED_FOR="203.0.113.99").status_code == 429


def test_an_oversized_username_is_a_form_error_not_a_cache_key():
    response = _login(APIClient(), "u" * 10_000, "guess")
    assert response.status_code == 400
    assert response.json()["errors"]["username"]


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_an_anonymous_login_body_over_16_kib_is_refused_before_it_is_read(content_type):
    body = b'{"username": "' + b"u" * 20_000 + b'", "password": "x"}'
    response = APIClient().post("/api/auth/login", body, content_type=content_type)
    assert response.status_code == 413
    assert "exceeds this endpoint's limit of 16384 bytes" in response.json()["detail"]


def test_an_api_body_over_the_request_limit_is_413_not_500(operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    body = b'{"name": "' + b"n" * 100_000 + b'"}'
    response = operator.post("/api/jobs", body, content_type="application/json")
    assert response.status_code == 413
    assert "limit of 65536 bytes (DEFL_MAX_REQUEST_BYTES)" in response.json()["detail"]


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_a_json_endpoint_refuses_a_form_body_unread_with_415(operator, content_type):
    """The schema states one media type for a JSON operation: a form of the same fields is a 415."""
    response = operator.post("/api/jobs", b"name=" + b"n" * 100_000, content_type=content_type)
    assert response.status_code == 415
    assert "Unsupported media type" in response.json()["detail"]


# ----------------------------------------------------------------------------- tokens


def _age(key: str, seconds: float) -> None:
    """Moves a token's expiry as if it had been issued ``seconds`` ago under DEFL_TOKEN_TTL_S."""
    from django.conf import settings

    expires = timezone.now() - timedelta(seconds=seconds) + timedelta(seconds=settings.DEFL_TOKEN_TTL_S)
    ApiToken.objects.filter(digest=digest(key)).update(expires=expires)


def test_an_expired_token_is_401_with_a_sentence_and_login_issues_a_new_one(settings):
    settings.DEFL_TOKEN_TTL_S = 3600
    create_or_update_user("eve", Role.VIEWER, password="s3cret-pass")
    old = _login(APIClient(), "eve", "s3cret-pass").json()["token"]
    _age(old, 3601)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {old}")
    response = client.get("/api/auth/me")
    assert response.status_code == 401
    assert "the token has expired" in response.json()["detail"]
    assert response["WWW-Authenticate"] == "Token"
    assert not ApiToken.objects.filter(digest=digest(old)).exists()

    fresh = _login(APIClient(), "eve", "s3cret-pass").json()["token"]
    assert fresh != old
    client.credentials(HTTP_AUTHORIZATION=f"Token {fresh}")
    assert client.get("/api/auth/me").json()["role"] == "viewer"


def test_a_token_inside_its_lifetime_works(settings):
    settings.DEFL_TOKEN_TTL_S = 3600
    create_or_update_user("fay", Role.VIEWER, password="s3cret-pass")
    key = _login(APIClient(), "fay", "s3cret-pass").json()["token"]
    _age(key, 3500)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/auth/me").status_code == 200


def test_only_the_keys_hash_is_stored():
    user, _ = create_or_update_user("gil", Role.VIEWER, password="s3cret-pass")
    key = api_token(user, "export")
    stored = ApiToken.objects.get(user=user)
    assert key not in (stored.digest, stored.prefix, stored.name) and stored.digest == digest(key)
    assert stored.prefix == key[:8]


# ----------------------------------------------------------------------------- error bodies

SECRETS = (
    "/srv/defl/data/keystore.json",
    "http://10.0.0.7:8101/api/swarm/chunks",
    "10.0.0.7:8101",
    "SELECT password FROM auth_user",
    "Traceback",
)


class PeerError(Exception):
    """Stands in for the swarm's family: mapped by its class name to 503."""


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.PROVIDER, Role.VIEWER])
@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "cannot open /srv/defl/data/keystore.json: Traceback ... SELECT password FROM auth_user"
        ),
        PeerError("peer http://10.0.0.7:8101/api/swarm/chunks refused at 10.0.0.7:8101"),
        OSError(2, "No such file or directory", "/srv/defl/data/keystore.json"),
    ],
    ids=["internal", "service", "oserror"],
)
def test_provoked_errors_name_no_path_peer_or_query_for_any_role(
    role, error, make_client, monkeypatch, caplog
):
    from backend.nodes import overview

    def broken():
        raise error

    monkeypatch.setattr(overview, "node_overview", broken)
    response = make_client(role).get("/api/node")
    assert response.status_code in (500, 503)
    detail = response.json()["detail"]
    assert detail
    for secret in SECRETS:
        assert secret not in response.content.decode()
    # The operator finds the whole error in the log.
    assert any("10.0.0.7" in r.getMessage() or r.exc_info for r in caplog.records)


def test_scrub_keeps_sentences_and_drops_internals():
    assert scrub("job 3 is running, not open for joining") == "job 3 is running, not open for joining"
    assert scrub("delete the dataset from the node first") == "delete the dataset from the node first"
    assert "/home" not in scrub("keystore /home/op/.defl/keystore.json is unreadable")
    assert "peer" in scrub("peer https://node-b.example:8443/x did not answer")
    assert "node-b.example" not in scrub("peer https://node-b.example:8443/x did not answer")
    assert "127.0.0.1" not in scrub("connection refused by 127.0.0.1:8545")


# ----------------------------------------------------------------------------- uploads


class EchoUpload(APIView):
    """Reports what the upload became and what the temp directories held while it was parsed."""

    permission_classes = [AnyRole]
    parser_classes = [MultiPartParser]  # a view that takes files says so (JSON is the default)

    def post(self, request):
        from django.conf import settings

        upload = request.FILES["file"]
        return Response(
            {
                "class": type(upload).__name__,
                "size": upload.size,
                "temp_files": sorted(os.listdir(settings.FILE_UPLOAD_TEMP_DIR)),
            }
        )


urlpatterns = [path("echo-upload", EchoUpload.as_view())]


@pytest.mark.urls(__name__)
def test_a_large_upload_stays_in_memory_and_leaves_no_temp_file(viewer, settings, tmp_path):
    payload = os.urandom(6 * 1024 * 1024)  # above Django's 2.5 MB spooling threshold
    (tmp_path / "upload.bin").write_bytes(payload)
    with open(tmp_path / "upload.bin", "rb") as handle:
        response = viewer.post("/echo-upload", {"file": handle}, format="multipart")
    assert response.status_code == 200, response.content
    assert response.json() == {"class": "InMemoryUploadedFile", "size": len(payload), "temp_files": []}
    assert os.listdir(settings.FILE_UPLOAD_TEMP_DIR) == []


@pytest.mark.urls(__name__)
def test_an_upload_over_the_limit_is_413_with_a_sentence(viewer, settings, tmp_path):
    settings.DEFL_MAX_UPLOAD_BYTES = 1024 * 1024
    (tmp_path / "big.bin").write_bytes(b"x" * (2 * 1024 * 1024))
    with open(tmp_path / "big.bin", "rb") as handle:
        response = viewer.post("/echo-upload", {"file": handle}, format="multipart")
    assert response.status_code == 413
    assert "exceeds this node's limit of 1048576 bytes" in response.json()["detail"]
    assert os.listdir(settings.FILE_UPLOAD_TEMP_DIR) == []


def test_the_handler_stops_a_stream_that_passes_the_limit_without_a_content_length(settings):
    settings.DEFL_MAX_UPLOAD_BYTES = 100
    handler = BoundedMemoryUploadHandler()
    handler.handle_raw_input(None, {}, None, b"boundary")  # chunked: no length to check up front
    handler.new_file("file", "a.bin", "application/octet-stream", None)
    handler.receive_data_chunk(b"x" * 60, 0)
    with pytest.raises(UploadTooLarge):
        handler.receive_data_chunk(b"x" * 60, 60)
