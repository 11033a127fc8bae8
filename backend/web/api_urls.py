"""/api/dashboard/ routes: read models the dashboard needs beyond the resource endpoints."""

from django.urls import path

from backend.web.api import GrantedDatasetsView, JoinCandidatesView, ModelCatalogView, OverviewView

urlpatterns = [
    path("dashboard/overview", OverviewView.as_view(), name="dashboard-overview"),
    path("dashboard/join-candidates", JoinCandidatesView.as_view(), name="dashboard-join-candidates"),
    path("dashboard/granted-datasets", GrantedDatasetsView.as_view(), name="dashboard-granted-datasets"),
    path("dashboard/models", ModelCatalogView.as_view(), name="dashboard-models"),
]
