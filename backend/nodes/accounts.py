"""Creating and changing users with a role (the users API, ``manage.py node adduser``, the tests)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from backend.identity.roles import Role, role_of
from backend.nodes import tokens
from backend.nodes.models import Profile


@transaction.atomic
def create_or_update_user(
    username: str, role: Role | str, password: str | None = None
) -> tuple[object, bool]:
    """Create the user (or change an existing one's role and password); returns (user, created).

    Without a password the account can only use API tokens, which is what scripts and other
    services want.
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


def api_token(user, name: str = "script") -> str:
    """A new named script token of the user (its key: shown once, stored as a hash)."""
    _, key = tokens.issue_script_token(user, name)
    return key


def active_operators(exclude=None) -> int:
    """How many enabled accounts act as operators, not counting ``exclude``."""
    users = get_user_model().objects.filter(is_active=True).select_related("profile")
    if exclude is not None:
        users = users.exclude(pk=exclude.pk)
    return sum(1 for user in users if role_of(user) == Role.OPERATOR)
