"""URL routes of a node: the REST API under /api/, its schema and Swagger UI, the admin."""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView


def health(_request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/health", health, name="health"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/swarm/", include("backend.swarm.urls")),
    path("api/", include("backend.jobs.urls")),
    path("api/", include("backend.api_urls")),
    path("", include("backend.web.urls")),  # the dashboard SPA catch-all: keep it the last entry
]
