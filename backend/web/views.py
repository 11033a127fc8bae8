"""Serves the dashboard: the built SPA's index.html for / and every client route.

The assets themselves (frontend/dist/assets/*) are static files that WhiteNoise
serves under STATIC_URL; only the HTML shell passes through Django, so that a
deep link such as /jobs/3 loads the app, which then routes on the client.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_safe

NOT_BUILT = (
    "<!doctype html><title>DeFL dashboard not built</title>"
    "<h1>The dashboard has not been built</h1>"
    "<p>Run <code>npm ci --prefix frontend && npm --prefix frontend run build</code> "
    "and restart the node. The REST API is available under <a href='/api/docs/'>/api/docs/</a>.</p>"
)


_shell: dict[Path, tuple[int, bytes, str]] = {}  # index.html -> (mtime_ns, bytes, etag)


def _read_shell(index: Path) -> tuple[bytes, str]:
    """index.html, read again only when a new build replaced it (every page load asks for it)."""
    mtime = index.stat().st_mtime_ns
    cached = _shell.get(index)
    if cached is None or cached[0] != mtime:
        html = index.read_bytes()
        cached = (mtime, html, '"' + hashlib.sha256(html).hexdigest()[:32] + '"')
        _shell[index] = cached
    return cached[1], cached[2]


@require_safe
def spa_index(request, path: str = ""):
    index = settings.DEFL_FRONTEND_DIST / "index.html"
    try:
        html, etag = _read_shell(index)
    except FileNotFoundError:
        return HttpResponse(NOT_BUILT, status=503)
    # The shell names the current build's hashed assets: never serve a stale one, but let the
    # browser revalidate it cheaply (304) while the build is unchanged.
    if request.headers.get("If-None-Match") == etag:
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(html, content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["ETag"] = etag
    return response
