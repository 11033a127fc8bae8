"""The node's settings for a test run: a random secret key, as a production node must have one.

A node with DJANGO_DEBUG off refuses to start without DJANGO_SECRET_KEY. pytest-django
imports the settings before any conftest runs, so the key is set here; node processes the
tests start inherit it unless they get their own (devnet.process.NodeProcess does).
"""

import os
import secrets

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

from backend.settings import *  # noqa: E402,F403
