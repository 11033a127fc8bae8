"""WSGI entry point of a node."""

import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.settings")
application = get_wsgi_application()
# Load every view now, as the server's worker starts, not on its first request: the views import the
# training stack (seconds), and a health probe or a user's first click would otherwise wait for it
# (or time out). A view that cannot be imported stops the worker at its start, where it is seen.
_views = get_resolver().url_patterns
