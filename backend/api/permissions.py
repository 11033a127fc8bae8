"""Role-based permissions: each view declares which roles may read and which may write.

A request without credentials never reaches these checks with a user: DRF turns a
failed permission for an anonymous request into 401 (TokenAuthentication is the
first authenticator, so the response carries ``WWW-Authenticate: Token``); an
authenticated user with the wrong role gets 403.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from backend.identity.roles import ALL_ROLES, Role, role_of


class RolePermission(BasePermission):
    """Reads need one of ``read_roles``, every other method one of ``write_roles``."""

    read_roles: tuple[Role, ...] = ALL_ROLES
    write_roles: tuple[Role, ...] = (Role.OPERATOR,)
    message = "your role does not allow this request"

    def has_permission(self, request, view) -> bool:
        role = role_of(request.user)
        if role is None:
            return False
        allowed = self.read_roles if request.method in SAFE_METHODS else self.write_roles
        return role in allowed


class OperatorWrites(RolePermission):
    """Node, jobs: everyone reads, only the operator changes anything."""


class ProviderWrites(RolePermission):
    """Datasets and grants: data providers and the operator write."""

    write_roles = (Role.OPERATOR, Role.PROVIDER)


class AnyRole(RolePermission):
    """Calls that change nothing stored even when they are POSTs (login-only checks, inference)."""

    write_roles = ALL_ROLES
