"""Fixtures of the cluster tests: users of each role, fast back-off, a clean worker registry."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.nodes.accounts import api_token, create_or_update_user


@pytest.fixture(autouse=True)
def cluster_settings(settings):
    settings.DEFL_CLUSTER_RETRY_BASE_S = 0.2
    settings.DEFL_CLUSTER_HEARTBEAT_S = 3600.0  # the tests beat by hand
    settings.DEFL_CLUSTER_WORKER_TIMEOUT_S = 60.0
    settings.DEFL_CLUSTER_USE_GPU = False  # the same slots with or without a GPU on the machine
    return settings


@pytest.fixture
def make_client(db):
    def make(role: Role | None) -> APIClient:
        client = APIClient()
        if role is not None:
            user, _ = create_or_update_user(f"{role.value}-user", role, password="correct horse")
            client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
        return client

    return make


@pytest.fixture
def operator(make_client) -> APIClient:
    return make_client(Role.OPERATOR)


@pytest.fixture
def viewer(make_client) -> APIClient:
    return make_client(Role.VIEWER)
