"""Accounts in headless Chromium against a real node: users managed by the operator, two devices
of one user signing in and out apart, a script token, each role's own account page, and the
upload and job forms stating their rules (frontend/e2e/accounts.mjs)."""

from __future__ import annotations

import json

import pytest

from tests.browser.conftest import REPO, run_e2e_script

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCREENSHOTS = REPO / "out" / "screenshots"


def test_users_devices_tokens_and_each_roles_account(node_server):
    result = run_e2e_script(
        "accounts.mjs",
        {
            "DEFL_URL": node_server.url,
            "DEFL_USERS": node_server.users_env(),
            "DEFL_SCREENSHOTS": str(SCREENSHOTS),
        },
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0 and summary["ok"], "\n".join(summary["failures"])
    assert summary["steps"] == [
        "user created",
        "role changed",
        "password reset",
        "disabled and enabled",
        "one device signed out, the other not",
        "another device signed out from the account page",
        "script token created, used, revoked",
        "job form",
        "provider account",
        "viewer account",
    ]
    assert (SCREENSHOTS / "operator-account-two-devices.png").stat().st_size > 10_000
