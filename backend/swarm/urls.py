"""Routes of the swarm store: the peer API between nodes and the user endpoints."""

urlpatterns: list = []
