"""The dashboard in headless Chromium against a real node: every page for every role."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.browser.conftest import REPO, run_e2e_script

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCREENSHOTS = REPO / "out" / "screenshots"


@pytest.fixture(scope="module", autouse=True)
def fresh_screenshots():
    """The screenshots of this run only (they are the test artifacts to look at)."""
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    SCREENSHOTS.mkdir(parents=True)


def test_each_role_sees_every_page_without_console_errors_and_only_what_it_may_do(node_server):
    result = run_e2e_script(
        "roles.mjs",
        {
            "DEFL_URL": node_server.url,
            "DEFL_USERS": node_server.users_env(),
            "DEFL_SCREENSHOTS": str(SCREENSHOTS),
        },
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0 and summary["ok"], "\n".join(summary["failures"])
    for role in ("operator", "provider", "viewer"):
        assert {"/", "/datasets", "/jobs", "/models"} <= set(summary["visited"][role])
        assert (SCREENSHOTS / f"{role}-overview.png").stat().st_size > 10_000
    assert "/jobs/new" in summary["visited"]["operator"]
    assert "/jobs/new (redirected)" in summary["visited"]["viewer"]


def test_job_dataset_and_models_pages_follow_a_running_job_without_reloading(node_server):
    """The API is mocked in the browser (frontend/e2e/fixtures), the SPA comes from the node."""
    result = run_e2e_script(
        "job-page.mjs", {"DEFL_URL": node_server.url, "DEFL_SCREENSHOTS": str(SCREENSHOTS)}
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0 and summary["ok"], "\n".join(summary["failures"])
    assert (SCREENSHOTS / "mocked-job.png").stat().st_size > 10_000
