"""/api/jobs routes (included from backend/urls.py)."""

from django.urls import path

from backend.api.routing import RecordRouter
from backend.jobs_api.views import JobViewSet, peer_update_key

router = RecordRouter(trailing_slash=False)  # no trailing slashes, as in docs/API.md
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    # node-signed peer request for a sealed update's key (backend.jobs.sealed)
    path("jobs/peer/update-key", peer_update_key, name="jobs-peer-update-key"),
    *router.urls,
]
