"""The three roles of a node's users and how a user's role is found.

A user has exactly one role, stored on ``nodes.Profile`` (a field rather than Django
groups: one role per user is the rule, and a single column makes that impossible to
break). A superuser created with ``createsuperuser`` has no profile and counts as an
operator, so the admin's account can always run its own node.
"""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    OPERATOR = "operator", "operator (runs the node and jobs)"
    PROVIDER = "provider", "data provider (uploads and grants datasets)"
    VIEWER = "viewer", "viewer (read only)"


ALL_ROLES: tuple[Role, ...] = (Role.OPERATOR, Role.PROVIDER, Role.VIEWER)


def role_of(user) -> Role | None:
    """The user's role, or None for anonymous users and users without one."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    profile = getattr(user, "profile", None)
    if profile is not None:
        return Role(profile.role)
    return Role.OPERATOR if user.is_superuser else None
