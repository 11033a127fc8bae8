"""The user API of the store in-process: who may write, the quota, multipart without temp files."""

from __future__ import annotations

import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.nodes.accounts import api_token, create_or_update_user
from backend.swarm import factory

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(settings, tmp_path):
    from backend.identity.key import node_account

    settings.DEFL_NODE_KEY = "0x" + "5d" * 32
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    settings.DEFL_PEERS = []
    settings.DEFL_CHAIN_URL = ""
    settings.DEFL_REPLICATION = 1
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "uploads")
    (tmp_path / "uploads").mkdir()
    caches = (
        node_account,
        factory.node_swarm,
        factory.local_store,
        factory.peer_directory,
        factory.own_address,
    )
    for cached in caches:
        cached.cache_clear()
    yield settings
    for cached in caches:
        cached.cache_clear()


def client(role: Role) -> APIClient:
    user, _ = create_or_update_user(f"{role.value}-user", role, password="correct horse")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return api


def upload(api: APIClient, data: bytes, query: str = ""):
    return api.post(f"/api/swarm/blobs{query}", data=data, content_type="application/octet-stream")


def test_only_operators_write_and_every_role_reads(node):
    operator, provider, viewer = client(Role.OPERATOR), client(Role.PROVIDER), client(Role.VIEWER)
    assert upload(viewer, b"x" * 100).status_code == 403
    assert upload(provider, b"x" * 100).status_code == 403
    created = upload(operator, b"x" * 100)
    assert created.status_code == 201, created.content
    reference = created.json()["reference"]
    for api in (operator, provider, viewer):
        assert api.get(f"/api/swarm/blobs/{reference}/stat").json()["size"] == 100
        assert api.get("/api/swarm/stat").status_code == 200


def test_uploads_beyond_the_pinned_quota_are_refused_with_a_sentence(node):
    node.DEFL_SWARM_PIN_QUOTA_BYTES = 10_000
    operator = client(Role.OPERATOR)
    assert upload(operator, os.urandom(6000), "?pin=1").status_code == 201
    refused = upload(operator, os.urandom(6000))
    assert refused.status_code == 413
    assert "quota" in refused.json()["detail"] and "6000" in refused.json()["detail"]
    assert upload(operator, os.urandom(3000)).status_code == 201


def test_a_download_larger_than_the_node_accepts_is_refused(node):
    operator = client(Role.OPERATOR)
    reference = upload(operator, os.urandom(5000)).json()["reference"]
    node.DEFL_SWARM_MAX_BLOB_BYTES = 4000
    assert operator.get(f"/api/swarm/blobs/{reference}").status_code >= 400
    node.DEFL_SWARM_MAX_BLOB_BYTES = 5000
    assert b"".join(operator.get(f"/api/swarm/blobs/{reference}").streaming_content) != b""


def test_a_multipart_upload_leaves_no_plaintext_temp_file(node, tmp_path, monkeypatch):
    from django.core.files import temp

    def no_spooling(*args, **kwargs):
        raise AssertionError("an upload was spooled to a temporary file")

    monkeypatch.setattr(temp, "NamedTemporaryFile", no_spooling)
    operator = client(Role.OPERATOR)
    marker = b"PLAINTEXT-MARKER!" * (4 * 1024 * 1024 // 17)  # over Django's 2.5 MB spooling threshold
    response = operator.post(
        "/api/swarm/blobs?encrypt=1",
        {"file": SimpleUploadedFile("secret.bin", marker)},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    assert response.json()["size"] == len(marker) and response.json()["encrypted"]
    assert list((tmp_path / "uploads").iterdir()) == []
    stored = [p for p in (tmp_path / "chunks").glob("??/*") if p.is_file()]
    assert stored and all(marker[:64] not in p.read_bytes() for p in stored)


@pytest.mark.parametrize("value", ["/etc/hostname", "/proc/self/environ", "manage.py", ""])
def test_a_multipart_text_part_is_never_opened_as_a_path(node, value):
    """A `file` part without a filename arrives as text; the node must not read a file it names."""
    operator = client(Role.OPERATOR)
    response = operator.post("/api/swarm/blobs", {"file": value}, format="multipart")
    assert response.status_code == 400, response.content
    assert "file" in response.json()["errors"]
    assert factory.local_store().usage().pinned_bytes == 0


def test_an_empty_raw_upload_is_refused_with_a_sentence(node):
    response = upload(client(Role.OPERATOR), b"")
    assert response.status_code in (400, 411) and response.json()["detail"]


def test_the_swarm_put_refuses_a_path():
    from backend.swarm.api import _open_source

    for source in ("/etc/hostname", __import__("pathlib").Path("/etc/hostname")):
        with pytest.raises(TypeError), _open_source(source):
            pass
