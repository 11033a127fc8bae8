"""The /api/ routes of accounts, this node, datasets and models (jobs and swarm add their own)."""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from backend.datasets.views import DatasetViewSet
from backend.nodes.auth_views import LoginView, LogoutView, MeView
from backend.nodes.views import EventListView, NodeView, PeerListView
from backend.serving.views import GlobalModelViewSet

# No trailing slashes, as in docs/API.md.
router = SimpleRouter(trailing_slash=False)
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("models", GlobalModelViewSet, basename="model")

urlpatterns = [
    path("auth/login", LoginView.as_view(), name="auth-login"),
    path("auth/logout", LogoutView.as_view(), name="auth-logout"),
    path("auth/me", MeView.as_view(), name="auth-me"),
    path("node", NodeView.as_view(), name="node"),
    path("peers", PeerListView.as_view(), name="peers"),
    path("events", EventListView.as_view(), name="events"),
    *router.urls,
    path("", include("backend.cluster.urls")),  # workers, slots, tasks (backend/cluster)
    path("", include("backend.web.api_urls")),  # the dashboard's read models (backend/web)
]
