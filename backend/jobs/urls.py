"""/api/jobs routes (included from backend/urls.py)."""

from rest_framework.routers import SimpleRouter

from backend.jobs.views import JobViewSet

router = SimpleRouter(trailing_slash=False)  # no trailing slashes, as in docs/API.md
router.register("jobs", JobViewSet, basename="job")

urlpatterns = router.urls
