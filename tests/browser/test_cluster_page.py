"""The Cluster page in headless Chromium against a real node whose cluster tables hold a worker,
a queued task and a failure; the job page's tasks panel against a mocked API (frontend/e2e/cluster.mjs)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.browser.conftest import REPO, TEST_NODE_KEY, run_e2e_script

pytestmark = [pytest.mark.browser, pytest.mark.slow]
WORKER = "w2@browser"

# Run in the node's own database (as manage.py shell): a 2-core worker, a task that failed once
# and waits for its retry, and one queued behind it.
SEED = f"""
from django.conf import settings
from backend.cluster import registry, runner
settings.DEFL_CLUSTER_CPU_CORES = 2
registry.register({WORKER!r}, queue={WORKER!r})
def broken():
    raise OSError("disk full")
try:
    runner.run(41, 1, broken)
except OSError:
    pass
runner.enqueue(42, 1)
"""


def test_cluster_page_and_tasks_panel(node_server):
    env = {
        **os.environ,
        "DEFL_DATA_DIR": str(node_server.data_dir),
        "DEFL_NODE_KEY": TEST_NODE_KEY,
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DEFL_CLUSTER_RETRY_BASE_S": "3600",  # the failed task stays queued for its retry
    }
    for name in ("DJANGO_DEBUG", "DATABASE_URL", "CELERY_BROKER_URL", "DEFL_CHAIN_URL", "DEFL_PEERS"):
        env.pop(name, None)
    subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "shell", "-c", SEED],
        cwd=REPO,
        env=env,
        check=True,
        timeout=300,
    )
    username, password = node_server.users["operator"]
    result = run_e2e_script(
        "cluster.mjs",
        {
            "DEFL_URL": node_server.url,
            "DEFL_OPERATOR": f"{username}:{password}",
            "DEFL_WORKER": WORKER,
            "DEFL_SCREENSHOTS": str(REPO / "out" / "screenshots"),
        },
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0 and summary["ok"], "\n".join(summary["failures"])
    assert summary["screenshots"] >= 3
