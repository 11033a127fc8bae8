"""Serves the dashboard: the built SPA's index.html for / and every client route.

The assets themselves (frontend/dist/assets/*) are static files that WhiteNoise
serves under STATIC_URL; only the HTML shell passes through Django, so that a
deep link such as /jobs/3 loads the app, which then routes on the client.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_safe

NOT_BUILT = (
    "<!doctype html><title>DeFL dashboard not built</title>"
    "<h1>The dashboard has not been built</h1>"
    "<p>Run <code>npm ci --prefix frontend && npm --prefix frontend run build</code> "
    "and restart the node. The REST API is available under <a href='/api/docs/'>/api/docs/</a>.</p>"
)


@require_safe
def spa_index(request, path: str = ""):
    index = settings.DEFL_FRONTEND_DIST / "index.html"
    try:
        html = index.read_bytes()
    except FileNotFoundError:
        return HttpResponse(NOT_BUILT, status=503)
    response = HttpResponse(html, content_type="text/html; charset=utf-8")
    # The shell names the current build's hashed assets: never serve a stale one.
    response["Cache-Control"] = "no-cache"
    return response
