"""Creating users with a role (used by ``manage.py node adduser`` and the tests)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token

from backend.api.authentication import token_expired
from backend.nodes.models import Profile
from backend.nodes.roles import Role


@transaction.atomic
def create_or_update_user(
    username: str, role: Role | str, password: str | None = None
) -> tuple[object, bool]:
    """Create the user (or change an existing one's role and password); returns (user, created).

    Without a password the account can only use an API token, which is what
    scripts and other services want.
    """
    role = Role(role)
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    if password:
        user.set_password(password)
    elif created:
        user.set_unusable_password()
    user.save()
    Profile.objects.update_or_create(user=user, defaults={"role": role})
    return user, created


def api_token(user) -> str:
    """The user's API token; an expired one is replaced by a fresh one (DEFL_TOKEN_TTL_S)."""
    token, _ = Token.objects.get_or_create(user=user)
    if token_expired(token):
        token.delete()
        token = Token.objects.create(user=user)
    return token.key
