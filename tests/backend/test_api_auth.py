"""Accounts: login opens a session and returns a token, logout revokes both, roles gate every family."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.nodes.accounts import create_or_update_user

pytestmark = pytest.mark.django_db


def test_login_returns_token_and_role_and_opens_a_session():
    create_or_update_user("ada", Role.PROVIDER, password="s3cret-pass")
    client = APIClient(enforce_csrf_checks=True)
    response = client.post("/api/auth/login", {"username": "ada", "password": "s3cret-pass"}, format="json")
    assert response.status_code == 200
    assert response.json()["user"] == {"username": "ada", "role": "provider"}
    assert len(response.json()["token"]) == 40
    # The session alone authenticates the dashboard afterwards.
    assert client.get("/api/auth/me").json() == {"username": "ada", "role": "provider"}
    # Writes over a session need the CSRF token that login set as a cookie.
    assert client.post("/api/auth/logout").status_code == 403
    csrf = client.cookies["csrftoken"].value
    assert client.post("/api/auth/logout", HTTP_X_CSRFTOKEN=csrf).status_code == 204
    assert client.get("/api/auth/me").status_code == 401


def test_token_works_until_logout():
    create_or_update_user("bob", Role.VIEWER, password="s3cret-pass")
    token = (
        APIClient().post("/api/auth/login", {"username": "bob", "password": "s3cret-pass"}).json()["token"]
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/auth/me").json()["role"] == "viewer"
    assert client.post("/api/auth/logout").status_code == 204
    assert client.get("/api/auth/me").status_code == 401


@pytest.mark.parametrize(
    "body", [{"username": "ada", "password": "wrong"}, {"username": "nobody", "password": "x"}]
)
def test_bad_login_is_401_with_one_message(body):
    create_or_update_user("ada", Role.OPERATOR, password="s3cret-pass")
    response = APIClient().post("/api/auth/login", body, format="json")
    assert response.status_code == 401
    assert "wrong username or password" in response.json()["detail"]


def test_login_form_errors_are_400_with_field_errors():
    response = APIClient().post("/api/auth/login", {"username": "ada"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["password"]
    assert response.json()["detail"].startswith("password:")


def test_user_without_role_is_refused(django_user_model):
    user = django_user_model.objects.create_user("norole", password="s3cret-pass")
    client = APIClient()
    client.force_authenticate(user)
    assert client.get("/api/node").status_code == 403


def test_missing_credentials_get_401_with_www_authenticate(anonymous):
    response = anonymous.get("/api/datasets")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


# Each endpoint family: (method, path, roles allowed). Write calls use bodies that are
# invalid on purpose: an allowed role gets past the permission check to a 400/404,
# a refused one stops at 403, an anonymous caller at 401.
FAMILIES = [
    ("get", "/api/auth/me", {"operator", "provider", "viewer"}),
    ("get", "/api/node", {"operator", "provider", "viewer"}),
    ("get", "/api/peers", {"operator", "provider", "viewer"}),
    ("get", "/api/events", {"operator", "provider", "viewer"}),
    ("get", "/api/datasets", {"operator", "provider", "viewer"}),
    ("post", "/api/datasets", {"operator", "provider"}),
    ("get", "/api/models", {"operator", "provider", "viewer"}),
    ("post", "/api/models/999/predict", {"operator", "provider", "viewer"}),
]


@pytest.mark.parametrize(("method", "path", "allowed"), FAMILIES)
@pytest.mark.parametrize("role", [None, Role.OPERATOR, Role.PROVIDER, Role.VIEWER])
def test_role_matrix(make_client, method, path, allowed, role):
    client = make_client(role)
    response = client.get(path) if method == "get" else client.post(path, {}, format="json")
    if role is None:
        assert response.status_code == 401
    elif role.value in allowed:
        assert response.status_code in (200, 400, 404), response.content
    else:
        assert response.status_code == 403
        assert response.json()["detail"] == "your role does not allow this request"
