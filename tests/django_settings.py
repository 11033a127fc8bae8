"""The node's settings for a test run: a random secret key, as a production node must have one.

A node with DJANGO_DEBUG off refuses to start without DJANGO_SECRET_KEY. pytest-django
imports the settings before any conftest runs, so the key is set here; node processes the
tests start inherit it unless they get their own (devnet.process.NodeProcess does).
"""

import os
import secrets

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

from backend.settings import *  # noqa: E402,F403

# The test process's own in-process worker (cluster.registry.ensure_local, registered by the first
# in-process dispatch) would beat from a background thread every 10 s. On the in-memory shared-cache
# test database a write that meets another connection's write lock fails at once ("database table
# is locked", no busy timeout), so a beat could fail whichever test wrote at that moment. Here the
# worker beats only when registered and stays live; the cluster tests, which test liveness, set
# their own values (tests/cluster/conftest.py). Node processes the tests start use backend.settings.
DEFL_CLUSTER_HEARTBEAT_S = 3600.0
DEFL_CLUSTER_WORKER_TIMEOUT_S = 86400.0

# Passwords this test process hashes use MD5: Django's PBKDF2 costs about a second of CPU a login
# on the 2-core machine, which made the login, lockout and account tests the slowest in-process
# ones, and what they test is who may log in, not the hash. Hashes made elsewhere (a node process,
# a previous release's database) still verify with the default hashers listed after it. Node
# processes the tests start use backend.settings, so their hashing is the production one.
from django.conf import global_settings  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]
