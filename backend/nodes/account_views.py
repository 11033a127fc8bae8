"""Users and tokens from the dashboard: operators manage accounts, everyone their own tokens.

- ``/api/users`` (operators): list, create with a role and a password, change the role,
  disable or enable, reset the password. A disabled account and a reset password end every
  login and token of that user; the last enabled operator cannot be disabled or demoted.
  ``manage.py node adduser`` stays for the first operator.
- ``/api/tokens``: every user lists their own logins (devices) and named script tokens,
  creates script tokens (the key is shown once) and revokes them; operators see, create and
  revoke everyone's.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.errors import Conflict, NotFound
from backend.api.permissions import AnyRole, RolePermission
from backend.api.schema import errors
from backend.identity.roles import Role, role_of
from backend.nodes import tokens
from backend.nodes.account_serializers import (
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenQuerySerializer,
    TokenSerializer,
    UserCreateSerializer,
    UserSerializer,
    UserUpdateSerializer,
)
from backend.nodes.accounts import active_operators, create_or_update_user
from backend.nodes.models import ApiToken, Profile

MAX_USERS_LISTED = 1000
MAX_TOKENS_LISTED = 1000


class OperatorsOnly(RolePermission):
    read_roles = (Role.OPERATOR,)
    write_roles = (Role.OPERATOR,)


def _user_row(user) -> dict:
    now = timezone.now()
    live = user.api_tokens.filter(expires__gt=now)
    role = role_of(user) if user.is_active else _stored_role(user)
    return {
        "id": user.pk,
        "username": user.get_username(),
        "role": role.value if role else None,
        "active": user.is_active,
        "date_joined": user.date_joined,
        "last_login": user.last_login,
        "logins": live.filter(kind=ApiToken.Kind.LOGIN).count(),
        "script_tokens": live.filter(kind=ApiToken.Kind.SCRIPT).count(),
    }


def _stored_role(user) -> Role | None:
    """A disabled user's role as stored (role_of answers None for a disabled account)."""
    profile = Profile.objects.filter(user=user).first()
    if profile is not None:
        return Role(profile.role)
    return Role.OPERATOR if user.is_superuser else None


def _user(pk: int):
    user = get_user_model().objects.filter(pk=pk).first()
    if user is None:
        raise NotFound(f"no user {pk} on this node")
    return user


class UserListView(APIView):
    permission_classes = [OperatorsOnly]

    @extend_schema(responses={200: UserSerializer(many=True)}, description="Every account of this node.")
    def get(self, request):
        users = get_user_model().objects.order_by("username")[:MAX_USERS_LISTED]
        return Response(UserSerializer([_user_row(user) for user in users], many=True).data)

    @extend_schema(
        request=UserCreateSerializer,
        responses={201: UserSerializer, **errors(409)},
        description="A new account with a role and a password (409 when the username is taken).",
    )
    def post(self, request):
        form = UserCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        with transaction.atomic():
            if get_user_model().objects.filter(username__iexact=data["username"]).exists():
                raise Conflict(f"the username {data['username']!r} is taken", field="username")
            user, _ = create_or_update_user(data["username"], data["role"], data["password"])
        return Response(UserSerializer(_user_row(user)).data, status=status.HTTP_201_CREATED)


class UserDetailView(APIView):
    permission_classes = [OperatorsOnly]
    http_method_names = ["get", "patch", "head", "options"]

    @extend_schema(responses={200: UserSerializer})
    def get(self, request, pk: int):
        return Response(UserSerializer(_user_row(_user(pk))).data)

    @extend_schema(
        request=UserUpdateSerializer,
        responses={200: UserSerializer, **errors(409)},
        description="Change the role, disable or enable the account, or reset its password. Disabling "
        "and a password reset end every login and token of the user (the caller's own current login "
        "excepted when it resets its own password). 409 when it would leave no enabled operator.",
    )
    def patch(self, request, pk: int):
        form = UserUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        with transaction.atomic():
            user = _user(pk)
            stays_operator = data.get("active", user.is_active) and (
                data.get("role", _stored_role(user)) == Role.OPERATOR
            )
            if _stored_role(user) == Role.OPERATOR and user.is_active and not stays_operator:
                if active_operators(exclude=user) == 0:
                    field = "active" if data.get("active") is False else "role"
                    raise Conflict(
                        "this is the node's last enabled operator: name another operator first", field=field
                    )
            if "role" in data:
                Profile.objects.update_or_create(user=user, defaults={"role": data["role"]})
            ended = False
            if "active" in data and data["active"] != user.is_active:
                user.is_active = data["active"]
                ended = not user.is_active
            if "password" in data:
                user.set_password(data["password"])
                ended = True
            user.save()
            if ended:
                ending = ApiToken.objects.filter(user=user)
                if isinstance(request.auth, ApiToken) and user.pk == request.user.pk:
                    ending = ending.exclude(pk=request.auth.pk)  # one's own reset keeps this login
                ending.delete()
        return Response(UserSerializer(_user_row(user)).data)


def _token_row(token: ApiToken, request) -> dict:
    return {
        "id": token.pk,
        "name": token.name,
        "kind": token.kind,
        "user": token.user.get_username(),
        "prefix": token.prefix,
        "created": token.created,
        "expires": token.expires,
        "last_used": token.last_used,
        "current": isinstance(request.auth, ApiToken) and request.auth.pk == token.pk,
    }


def _is_operator(request) -> bool:
    return role_of(request.user) == Role.OPERATOR


class TokenListView(APIView):
    permission_classes = [AnyRole]

    @extend_schema(
        parameters=[TokenQuerySerializer],
        responses={200: TokenSerializer(many=True)},
        description="The caller's live logins and script tokens; an operator's list has every user's "
        "(``user`` narrows it to one username).",
    )
    def get(self, request):
        query = TokenQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        found = ApiToken.objects.select_related("user").filter(expires__gt=timezone.now())
        if not _is_operator(request):
            found = found.filter(user=request.user)
        if "user" in query.validated_data:
            found = found.filter(user__username=query.validated_data["user"])
        if "kind" in query.validated_data:
            found = found.filter(kind=query.validated_data["kind"])
        rows = [_token_row(token, request) for token in found[:MAX_TOKENS_LISTED]]
        return Response(TokenSerializer(rows, many=True).data)

    @extend_schema(
        request=TokenCreateSerializer,
        responses={201: TokenCreatedSerializer, **errors(409)},
        description="A named token for a script; its key is in this answer only. Operators may name "
        "another user (409 when that user does not exist or is disabled).",
    )
    def post(self, request):
        form = TokenCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        owner = request.user
        if data.get("user") and data["user"] != request.user.get_username():
            if not _is_operator(request):
                raise PermissionDenied("only an operator may create a token for another user")
            owner = get_user_model().objects.filter(username=data["user"], is_active=True).first()
            if owner is None or role_of(owner) is None:
                raise Conflict(f"no enabled user {data['user']!r} with a role on this node", field="user")
        token, key = tokens.issue_script_token(owner, data["name"].strip(), data["days"])
        body = {**_token_row(token, request), "token": key}
        return Response(TokenCreatedSerializer(body).data, status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    permission_classes = [AnyRole]
    http_method_names = ["delete", "options"]

    @extend_schema(
        responses={204: None},
        description="Revoke a token: the caller's own (a login on another device, a script's), or "
        "for an operator anyone's. Revoking the token of this request is a logout.",
    )
    def delete(self, request, pk: int):
        found = ApiToken.objects.filter(pk=pk)
        if not _is_operator(request):
            found = found.filter(user=request.user)
        if not found.delete()[0]:
            raise NotFound(f"no token {pk} of yours on this node")
        return Response(status=status.HTTP_204_NO_CONTENT)
