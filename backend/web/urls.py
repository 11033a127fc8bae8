"""The SPA catch-all: any path that is not the API, the admin or a static file is a client route."""

from django.urls import re_path

from backend.web.views import spa_index

urlpatterns = [
    re_path(r"^(?!api/|admin/|static/)(?P<path>.*)$", spa_index, name="dashboard"),
]
