"""Routes of the swarm store: the peer API between nodes and the user endpoints."""

from django.urls import path

from backend.swarm import views

urlpatterns = [
    path("peer/chunks", views.peer_push, name="swarm-peer-push"),
    path("peer/fetch", views.peer_fetch, name="swarm-peer-fetch"),
    path("peer/has", views.peer_has, name="swarm-peer-has"),
    path("peer/verify", views.peer_verify, name="swarm-peer-verify"),
    path("blobs", views.UploadView.as_view(), name="swarm-upload"),
    path("blobs/<str:reference>", views.DownloadView.as_view(), name="swarm-download"),
    path("blobs/<str:reference>/stat", views.StatView.as_view(), name="swarm-stat"),
    path("stat", views.NodeStatView.as_view(), name="swarm-node-stat"),
]
