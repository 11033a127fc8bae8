"""The /api/ routes of accounts, this node, datasets and models (jobs and swarm add their own)."""

from django.urls import include, path, re_path

from backend.api.fallback import api_not_found
from backend.api.routing import RecordRouter
from backend.datasets.views import DatasetViewSet
from backend.nodes.account_views import TokenDetailView, TokenListView, UserDetailView, UserListView
from backend.nodes.auth_views import LoginView, LogoutView, MeView
from backend.nodes.views import EventListView, NodeView, PeerListView
from backend.serving.views import GlobalModelViewSet

# No trailing slashes, as in docs/API.md.
router = RecordRouter(trailing_slash=False)
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("models", GlobalModelViewSet, basename="model")

urlpatterns = [
    path("auth/login", LoginView.as_view(), name="auth-login"),
    path("auth/logout", LogoutView.as_view(), name="auth-logout"),
    path("auth/me", MeView.as_view(), name="auth-me"),
    path("users", UserListView.as_view(), name="users"),
    path("users/<id:pk>", UserDetailView.as_view(), name="user"),
    path("tokens", TokenListView.as_view(), name="tokens"),
    path("tokens/<id:pk>", TokenDetailView.as_view(), name="token"),
    path("node", NodeView.as_view(), name="node"),
    path("peers", PeerListView.as_view(), name="peers"),
    path("events", EventListView.as_view(), name="events"),
    *router.urls,
    path("", include("backend.cluster.urls")),  # workers, slots, tasks (backend/cluster)
    path("", include("backend.web.api_urls")),  # the dashboard's read models (backend/web)
    # Last of every /api/ route (backend/urls.py includes this module after the others): a path
    # no endpoint matched is a JSON 404, never Django's HTML page.
    re_path(r"^", api_not_found, name="api-not-found"),
]
