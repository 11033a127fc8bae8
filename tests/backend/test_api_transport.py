"""What every answer carries on the wire: a Content-Security-Policy, gzipped JSON, JSON errors on
every /api/ path, HTTPS-only cookies and HSTS on a node served over HTTPS (not on the loopback
development setup)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def test_every_answer_carries_the_content_security_policy(operator):
    for response in (
        operator.get("/api/auth/me"),
        APIClient().get("/api/health"),
        APIClient().get("/jobs/3"),
    ):
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "unsafe-eval" not in policy and "script-src 'self' 'unsafe-inline'" not in policy


def test_json_is_gzipped_for_a_client_that_accepts_it_and_plain_for_one_that_does_not(operator):
    packed = operator.get("/api/jobs/limits", HTTP_ACCEPT_ENCODING="gzip")
    assert packed["Content-Encoding"] == "gzip" and "Accept-Encoding" in packed["Vary"]
    plain = operator.get("/api/jobs/limits")
    assert not plain.has_header("Content-Encoding")
    assert json.loads(gzip.decompress(packed.content)) == plain.json()


def test_html_and_streamed_answers_are_not_gzipped_by_the_api_middleware(operator):
    page = APIClient().get("/datasets", HTTP_ACCEPT_ENCODING="gzip")
    assert page.status_code in (200, 503) and not page.has_header("Content-Encoding")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/nothing-here"),
        ("post", "/api/jobs/1/explode"),
        ("get", "/api/jobs/abc"),
        ("delete", "/api/x"),
    ],
)
def test_an_unknown_api_path_is_a_json_404_for_anyone(operator, method, path):
    for client in (operator, APIClient()):
        response = getattr(client, method)(path)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert "no API endpoint at this path" in response.json()["detail"]


def test_a_known_path_without_its_slash_still_finds_its_page():
    response = APIClient().get("/api/docs")
    assert response.status_code == 301 and response["Location"] == "/api/docs/"


def _security_settings(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DEFL_"))}
    code = (
        "import json; from django.conf import settings as s; print(json.dumps([s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, getattr(s, 'SECURE_PROXY_SSL_HEADER', None)]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=base
        | {
            "DJANGO_SETTINGS_MODULE": "backend.settings",
            "DJANGO_SECRET_KEY": "k" * 50,
            "DEFL_DATA_DIR": "/tmp/defl-transport-test",
        }
        | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    secure, csrf, hsts, proxy = json.loads(result.stdout.strip().splitlines()[-1])
    return {"secure": secure, "csrf": csrf, "hsts": hsts, "proxy": proxy}


def test_a_node_served_over_https_sends_secure_cookies_and_hsts():
    found = _security_settings(DEFL_NODE_ENDPOINT="https://node.example.org")
    assert found == {"secure": True, "csrf": True, "hsts": 365 * 24 * 3600, "proxy": None}
    behind_proxy = _security_settings(DEFL_NODE_ENDPOINT="https://node.example.org", DEFL_NUM_PROXIES="1")
    assert behind_proxy["proxy"] == ["HTTP_X_FORWARDED_PROTO", "https"]


@pytest.mark.parametrize(
    "env",
    [
        {"DEFL_NODE_ENDPOINT": "http://127.0.0.1:8101"},
        {"DEFL_NODE_ENDPOINT": "https://node.example.org", "DJANGO_DEBUG": "1"},
    ],
)
def test_the_loopback_and_debug_setups_keep_plain_cookies(env):
    assert _security_settings(**env) == {"secure": False, "csrf": False, "hsts": 0, "proxy": None}


def test_a_session_write_to_an_unknown_api_path_is_a_json_404_not_a_csrf_page(settings):
    from backend.identity.roles import Role
    from backend.nodes.accounts import create_or_update_user

    create_or_update_user("sam", Role.OPERATOR, password="s3cret-pass")
    browser = APIClient(enforce_csrf_checks=True)
    browser.post("/api/auth/login", {"username": "sam", "password": "s3cret-pass"}, format="json")
    response = browser.delete("/api/datasets/60/grants/last/more")  # no X-CSRFToken, a session cookie
    assert response.status_code == 404 and response["Content-Type"] == "application/json"


def test_a_csrf_refusal_on_an_api_path_is_json():
    from django.test import RequestFactory

    from backend.api.fallback import csrf_failure

    refused = csrf_failure(RequestFactory().post("/api/anything"), reason="CSRF cookie not set.")
    assert refused.status_code == 403 and json.loads(refused.content)["detail"].startswith(
        "CSRF check failed"
    )
    assert b"<html" in csrf_failure(RequestFactory().post("/admin/login/"), reason="x").content


def test_the_schema_is_json_a_browser_shows_and_yaml_on_request(anonymous):
    response = anonymous.get("/api/schema/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    assert "attachment" not in response.get("Content-Disposition", "")
    assert json.loads(response.content)["openapi"].startswith("3.")
    assert anonymous.get("/api/schema/?format=yaml")["Content-Type"].startswith("application/vnd.oai.openapi")


def test_swagger_ui_runs_no_inline_script(anonymous):
    page = anonymous.get("/api/docs/")
    assert page.status_code == 200
    assert b"<script>" not in page.content  # the policy's script-src 'self' would block it
    script = anonymous.get("/api/docs/?script=")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")


@pytest.mark.parametrize("query", ["?pin=maybe", "?encrypt=2", "?pin="])
def test_a_blob_upload_flag_that_is_not_a_boolean_is_a_400(operator, query):
    response = operator.post(f"/api/swarm/blobs{query}", b"data", content_type="application/octet-stream")
    assert response.status_code == 400, response.content
    assert set(response.json()["errors"]) <= {"pin", "encrypt"}


def test_a_blob_no_node_holds_is_a_404_not_a_503(operator):
    """Every node asked answered that it holds no copy: the blob is not there (a 503 means some
    node could not be asked, so the blob may exist)."""
    response = operator.get("/api/swarm/blobs/" + "0" * 64)
    assert response.status_code == 404, response.content
    assert operator.get("/api/swarm/blobs/" + "0" * 64 + "/stat").status_code == 404
