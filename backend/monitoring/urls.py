"""Routes of the monitoring endpoints (mounted at the site root by backend/urls.py)."""

from django.urls import path

from backend.monitoring import views

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    path("api/health/live", views.live, name="health-live"),
    path("api/health/ready", views.ready, name="health-ready"),
]
