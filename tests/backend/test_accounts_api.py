"""Logins per device, named script tokens, and the operators' user management (/api/users, /api/tokens)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.nodes.accounts import api_token, create_or_update_user
from backend.nodes.models import ApiToken

pytestmark = pytest.mark.django_db


def _login(username: str, password: str = "s3cret-pass", **extra) -> tuple[APIClient, dict]:
    """A device: its own client (cookies) and its login's answer; it then uses its token."""
    client = APIClient()
    response = client.post(
        "/api/auth/login", {"username": username, "password": password, **extra}, format="json"
    )
    assert response.status_code == 200, response.content
    client.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    return client, response.json()


def _with_token(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


# ----------------------------------------------------------------------------- logins per device


def test_each_login_has_its_own_token_and_a_logout_ends_that_login_only():
    user, _ = create_or_update_user("ada", Role.OPERATOR, password="s3cret-pass")
    script = api_token(user, "nightly export")
    laptop, first = _login("ada", device="laptop")
    phone, second = _login("ada", device="phone")
    assert first["token"] != second["token"]
    assert laptop.post("/api/auth/logout").status_code == 204
    assert laptop.get("/api/auth/me").status_code == 401
    assert phone.get("/api/auth/me").json()["username"] == "ada"
    assert _with_token(script).get("/api/auth/me").status_code == 200
    assert sorted(ApiToken.objects.values_list("name", flat=True)) == ["nightly export", "phone"]


def test_a_logout_through_the_session_ends_that_browsers_token_and_no_other_session():
    create_or_update_user("bea", Role.VIEWER, password="s3cret-pass")
    first = APIClient(enforce_csrf_checks=True)
    token = first.post(
        "/api/auth/login", {"username": "bea", "password": "s3cret-pass"}, format="json"
    ).json()
    second = APIClient(enforce_csrf_checks=True)
    second.post("/api/auth/login", {"username": "bea", "password": "s3cret-pass"}, format="json")
    csrf = first.cookies["csrftoken"].value
    assert first.post("/api/auth/logout", HTTP_X_CSRFTOKEN=csrf).status_code == 204
    assert first.get("/api/auth/me").status_code == 401
    assert _with_token(token["token"]).get("/api/auth/me").status_code == 401  # its token ended too
    assert second.get("/api/auth/me").json()["username"] == "bea"  # the other browser's session lives


def test_a_login_is_named_after_its_browser_unless_it_names_itself():
    create_or_update_user("cid", Role.VIEWER, password="s3cret-pass")
    agent = (
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/140.0 Safari/537.36"
    )
    client = APIClient(HTTP_USER_AGENT=agent)
    client.post("/api/auth/login", {"username": "cid", "password": "s3cret-pass"}, format="json")
    _login("cid", device="  build server <7>  ")
    assert sorted(ApiToken.objects.values_list("name", flat=True)) == ["Chrome on Linux", "build server 7"]


# ----------------------------------------------------------------------------- script tokens


def test_a_user_creates_lists_and_revokes_their_own_script_tokens(provider):
    created = provider.post("/api/tokens", {"name": "uploader", "days": 7}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (
        body["kind"] == "script"
        and body["user"] == "provider-user"
        and body["token"].startswith(body["prefix"])
    )
    listed = provider.get("/api/tokens").json()
    assert "token" not in listed[0]  # the key is shown once
    assert {row["name"] for row in listed} >= {"uploader"}
    assert [row["current"] for row in listed if row["name"] == "uploader"] == [False]
    assert _with_token(body["token"]).get("/api/auth/me").json()["role"] == "provider"
    assert provider.delete(f"/api/tokens/{body['id']}").status_code == 204
    assert _with_token(body["token"]).get("/api/auth/me").status_code == 401


def test_only_an_operator_sees_and_revokes_other_users_tokens(operator, provider, viewer):
    mine = provider.post("/api/tokens", {"name": "provider script"}, format="json").json()
    assert all(row["user"] == "viewer-user" for row in viewer.get("/api/tokens").json())
    assert viewer.delete(f"/api/tokens/{mine['id']}").status_code == 404
    refused = viewer.post("/api/tokens", {"name": "x", "user": "provider-user"}, format="json")
    assert refused.status_code == 403
    everyone = operator.get("/api/tokens", {"user": "provider-user"}).json()
    assert {row["name"] for row in everyone} >= {"provider script"}
    assert operator.delete(f"/api/tokens/{mine['id']}").status_code == 204
    assert _with_token(mine["token"]).get("/api/auth/me").status_code == 401
    made = operator.post("/api/tokens", {"name": "for the viewer", "user": "viewer-user"}, format="json")
    assert made.status_code == 201 and made.json()["user"] == "viewer-user"
    missing = operator.post("/api/tokens", {"name": "x", "user": "nobody"}, format="json")
    assert missing.status_code == 409 and missing.json()["errors"]["user"]


@pytest.mark.parametrize(
    ("query", "field"), [({"kind": "session"}, "kind"), ({"kind": ""}, "kind"), ({"user": "u" * 151}, "user")]
)
def test_a_bad_token_query_is_400_naming_the_parameter(operator, query, field):
    response = operator.get("/api/tokens", query)
    assert response.status_code == 400 and field in response.json()["errors"]


# ----------------------------------------------------------------------------- users


def test_an_operator_creates_a_user_who_can_then_log_in(operator):
    created = operator.post(
        "/api/users", {"username": "dora", "role": "provider", "password": "long-enough-1"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["role"] == "provider" and created.json()["active"] is True
    client, _ = _login("dora", "long-enough-1")
    assert client.get("/api/auth/me").json() == {"username": "dora", "role": "provider"}
    again = operator.post(
        "/api/users", {"username": "DORA", "role": "viewer", "password": "long-enough-1"}, format="json"
    )
    assert again.status_code == 409 and again.json()["errors"]["username"]
    short = operator.post(
        "/api/users", {"username": "eli", "role": "viewer", "password": "short"}, format="json"
    )
    assert short.status_code == 400 and short.json()["errors"]["password"]


@pytest.mark.parametrize("role", ["provider", "viewer"])
def test_only_operators_manage_users(make_client, role):
    client = make_client(Role(role))
    assert client.get("/api/users").status_code == 403
    body = {"username": "x", "role": "operator", "password": "long-enough-1"}
    assert client.post("/api/users", body, format="json").status_code == 403
    assert (
        client.patch(f"/api/users/{client.user.pk}", {"role": "operator"}, format="json").status_code == 403
    )


def test_changing_a_role_takes_effect_at_the_next_request(operator):
    user, _ = create_or_update_user("fin", Role.VIEWER, password="s3cret-pass")
    client, _ = _login("fin")
    assert client.post("/api/datasets", {}, format="json").status_code == 403
    changed = operator.patch(f"/api/users/{user.pk}", {"role": "provider"}, format="json")
    assert changed.status_code == 200 and changed.json()["role"] == "provider"
    assert client.post("/api/datasets", {}, format="json").status_code == 400  # past the role check


def test_disabling_a_user_ends_every_login_and_token_and_refuses_new_ones(operator):
    user, _ = create_or_update_user("gia", Role.PROVIDER, password="s3cret-pass")
    device, _ = _login("gia")
    script = _with_token(api_token(user))
    disabled = operator.patch(f"/api/users/{user.pk}", {"active": False}, format="json")
    assert disabled.status_code == 200 and disabled.json()["active"] is False
    assert disabled.json()["role"] == "provider"  # kept for when it is enabled again
    assert device.get("/api/auth/me").status_code == 401
    assert script.get("/api/auth/me").status_code == 401
    refused = APIClient().post(
        "/api/auth/login", {"username": "gia", "password": "s3cret-pass"}, format="json"
    )
    assert refused.status_code == 401
    assert operator.patch(f"/api/users/{user.pk}", {"active": True}, format="json").status_code == 200
    _login("gia")


def test_a_password_reset_ends_the_users_logins_and_the_new_password_works(operator):
    user, _ = create_or_update_user("hal", Role.VIEWER, password="s3cret-pass")
    device, _ = _login("hal")
    reset = operator.patch(f"/api/users/{user.pk}", {"password": "a-new-password-2"}, format="json")
    assert reset.status_code == 200
    assert device.get("/api/auth/me").status_code == 401
    _login("hal", "a-new-password-2")


def test_resetting_ones_own_password_keeps_this_login_and_ends_the_others():
    user, _ = create_or_update_user("ivy", Role.OPERATOR, password="s3cret-pass")
    create_or_update_user("root", Role.OPERATOR, password="s3cret-pass")
    here, _ = _login("ivy")
    elsewhere, _ = _login("ivy")
    assert (
        here.patch(f"/api/users/{user.pk}", {"password": "another-pass-3"}, format="json").status_code == 200
    )
    assert here.get("/api/auth/me").status_code == 200
    assert elsewhere.get("/api/auth/me").status_code == 401


def test_the_last_enabled_operator_cannot_be_disabled_or_demoted(operator):
    me = operator.user
    for change, field in (({"active": False}, "active"), ({"role": "viewer"}, "role")):
        response = operator.patch(f"/api/users/{me.pk}", change, format="json")
        assert response.status_code == 409 and field in response.json()["errors"]
    other, _ = create_or_update_user("jon", Role.OPERATOR, password="s3cret-pass")
    assert operator.patch(f"/api/users/{other.pk}", {"role": "viewer"}, format="json").status_code == 200
    assert operator.patch(f"/api/users/{me.pk}", {"role": "viewer"}, format="json").status_code == 409


def test_an_unknown_user_is_a_json_404(operator):
    assert operator.get("/api/users/999999").status_code == 404
    assert operator.patch("/api/users/999999", {"role": "viewer"}, format="json").json()["detail"]


def test_a_drf_token_from_before_the_upgrade_keeps_working_until_it_would_have_expired():
    from importlib import import_module

    from django.apps import apps
    from django.db import connection
    from rest_framework.authtoken.models import Token

    user, _ = create_or_update_user("old", Role.VIEWER)
    old = Token.objects.create(user=user)
    import_module("backend.nodes.migrations.0004_tokens_from_drf").carry_over(
        apps, connection.schema_editor()
    )
    assert _with_token(old.key).get("/api/auth/me").json()["username"] == "old"
    carried = ApiToken.objects.get(user=user)
    assert carried.kind == "script" and carried.digest != old.key and carried.created == old.created
