"""Only this part's /api/ routes, so its schema check does not depend on other apps' views."""

from django.urls import include, path

urlpatterns = [path("api/", include("backend.api_urls"))]
