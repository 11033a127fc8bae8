"""Creating users with a role (used by ``manage.py node adduser`` and the tests)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token

from backend.api.authentication import token_expired
from backend.identity.roles import Role
from backend.nodes.models import Profile


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


def api_token(user, *, valid_for_s: float = 0) -> str:
    """The user's API token, replaced by a fresh one when it expires within ``valid_for_s`` seconds.

    A login asks for half the lifetime (DEFL_TOKEN_TTL_S), so it never hands out a token about
    to expire, while clients that share the account keep theirs for most of its life.
    """
    token, _ = Token.objects.get_or_create(user=user)
    if token_expired(token, margin_s=valid_for_s):
        token.delete()
        token = Token.objects.create(user=user)
    return token.key
