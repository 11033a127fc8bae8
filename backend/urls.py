"""URL routes of a node: the REST API under /api/, its schema and Swagger UI, the admin."""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerSplitView

from backend.api.schema_view import NodeSchemaView


def health(_request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/health", health, name="health"),
    path("", include("backend.monitoring.urls")),  # /metrics, /api/health/live, /api/health/ready
    path("api/schema/", NodeSchemaView.as_view(), name="schema"),
    # Swagger UI's own script comes from a URL, not inline: the Content-Security-Policy allows it.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/swarm/", include("backend.swarm.urls")),
    path("api/", include("backend.jobs_api.urls")),
    path("api/", include("backend.api_urls")),
    path("", include("backend.web.urls")),  # the dashboard SPA catch-all: keep it the last entry
]

# A crash outside DRF on an /api/ path answers JSON too (backend.api.fallback).
handler500 = "backend.api.fallback.server_error"
