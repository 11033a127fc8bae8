"""The node serves the dashboard: index.html for / and client routes, the API and admin untouched."""

from __future__ import annotations

import os
import re

import pytest
from django.test import override_settings

from tests.browser.conftest import FRONTEND


@pytest.fixture
def built_dist(tmp_path):
    (tmp_path / "index.html").write_text(
        "<!doctype html><div id=app></div><script src=/static/assets/index-abcdEF12.js></script>"
    )
    with override_settings(DEFL_FRONTEND_DIST=tmp_path):
        yield tmp_path


@pytest.mark.parametrize("path", ["/", "/jobs/3", "/datasets", "/login?redirect=/models"])
def test_client_routes_get_the_spa_shell(client, built_dist, path):
    response = client.get(path)
    assert response.status_code == 200
    assert b"<div id=app>" in response.content
    assert response["Content-Type"].startswith("text/html")
    assert response["Cache-Control"] == "no-cache"


@pytest.mark.parametrize("path", ["/api/does-not-exist", "/static/nothing.js"])
def test_api_and_static_paths_are_not_swallowed_by_the_spa(client, built_dist, path):
    assert client.get(path).status_code == 404


def test_writes_to_the_spa_are_refused(client, built_dist):
    assert client.post("/jobs/3").status_code == 405


def test_an_unbuilt_dashboard_says_how_to_build_it(client, tmp_path):
    with override_settings(DEFL_FRONTEND_DIST=tmp_path / "missing"):
        response = client.get("/")
    assert response.status_code == 503
    assert b"npm --prefix frontend run build" in response.content


@pytest.mark.skipif(not (FRONTEND / "dist" / "index.html").exists(), reason="dashboard not built")
def test_the_real_build_references_only_assets_that_exist():
    html = (FRONTEND / "dist" / "index.html").read_text()

    assets = re.findall(r'(?:src|href)="/static/(assets/[^"]+)"', html)
    assert assets, "index.html references no assets under /static/"
    for asset in assets:
        assert (FRONTEND / "dist" / asset).is_file(), asset


@pytest.mark.skipif(not (FRONTEND / "dist" / "index.html").exists(), reason="dashboard not built")
def test_hashed_assets_come_precompressed_and_cached_for_good(client):
    html = (FRONTEND / "dist" / "index.html").read_text()
    entry = re.search(r'src="(/static/assets/index-[^"]+\.js)"', html).group(1)
    raw = client.get(entry)
    assert raw.status_code == 200 and "Content-Encoding" not in raw
    raw_size = len(b"".join(raw.streaming_content))
    for encoding in ("br", "gzip"):
        response = client.get(entry, HTTP_ACCEPT_ENCODING=encoding)
        assert response.status_code == 200
        assert response["Content-Encoding"] == encoding
        assert "Accept-Encoding" in response["Vary"]
        assert "immutable" in response["Cache-Control"] and "max-age=315360000" in response["Cache-Control"]
        assert len(b"".join(response.streaming_content)) < raw_size / 2


def test_swagger_ui_is_served_by_the_node_without_a_cdn(client):
    from django.contrib.staticfiles import finders

    html = client.get("/api/docs/").content.decode()
    assert "cdn.jsdelivr" not in html and "unpkg" not in html
    scripts = re.findall(r'src="([^"]+\.js)"', html)
    assert scripts and all(src.startswith("/static/drf_spectacular_sidecar/") for src in scripts)
    for src in scripts:
        assert finders.find(src.removeprefix("/static/")), src
        assert client.get(src).status_code == 200, src


def test_the_shell_revalidates_with_its_etag_and_follows_a_new_build(client, built_dist):
    first = client.get("/jobs/3")
    etag = first["ETag"]
    again = client.get("/datasets", HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again["Cache-Control"] == "no-cache"
    index = built_dist / "index.html"
    index.write_text(
        "<!doctype html><div id=app></div><script src=/static/assets/index-NEWbuild.js></script>"
    )
    os.utime(index, ns=(index.stat().st_mtime_ns + 10**9,) * 2)
    rebuilt = client.get("/", HTTP_IF_NONE_MATCH=etag)
    assert rebuilt.status_code == 200 and b"index-NEWbuild" in rebuilt.content and rebuilt["ETag"] != etag
