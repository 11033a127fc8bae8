"""Request and response shapes of the users and tokens endpoints (backend.nodes.account_views)."""

from __future__ import annotations

from django.contrib.auth import password_validation
from django.core.validators import RegexValidator
from rest_framework import serializers

from backend.api.query import QuerySerializer
from backend.identity.roles import Role
from backend.nodes.models import ApiToken
from backend.nodes.tokens import DEFAULT_SCRIPT_TOKEN_DAYS, MAX_SCRIPT_TOKEN_DAYS

USERNAME_PATTERN = r"^[A-Za-z0-9_.@+-]+$"
# A name must say something: not empty once its surrounding spaces are trimmed.
NOT_BLANK = RegexValidator(r"\S", "must not be blank")


def _password(required: bool) -> serializers.CharField:
    return serializers.CharField(
        min_length=8,
        max_length=256,
        required=required,
        trim_whitespace=False,
        write_only=True,
        style={"input_type": "password"},
        help_text="at least 8 characters",
    )


class UserSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    role = serializers.ChoiceField(
        choices=Role.choices, allow_null=True, help_text="null: no role (no access)"
    )
    active = serializers.BooleanField(help_text="false: disabled, every login and token refused")
    date_joined = serializers.DateTimeField()
    last_login = serializers.DateTimeField(allow_null=True)
    logins = serializers.IntegerField(help_text="live logins (devices)")
    script_tokens = serializers.IntegerField(help_text="live named tokens")


class UserCreateSerializer(serializers.Serializer):
    # ASCII letters, digits and @.+-_ : what the schema's pattern says in every regex dialect.
    username = serializers.RegexField(USERNAME_PATTERN, max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)
    password = _password(required=True)

    def validate_password(self, value: str) -> str:
        password_validation.validate_password(value)
        return value


class UserUpdateSerializer(serializers.Serializer):
    """Any of: a new role, enabling or disabling the account, a new password (a reset)."""

    role = serializers.ChoiceField(choices=Role.choices, required=False)
    active = serializers.BooleanField(required=False)
    password = _password(required=False)

    def validate_password(self, value: str) -> str:
        password_validation.validate_password(value)
        return value


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=ApiToken.Kind.choices)
    user = serializers.CharField(help_text="the username the token acts as")
    prefix = serializers.CharField(help_text="the key's first characters")
    created = serializers.DateTimeField()
    expires = serializers.DateTimeField()
    last_used = serializers.DateTimeField(allow_null=True)
    current = serializers.BooleanField(help_text="the token of this very request")


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(
        max_length=100, validators=[NOT_BLANK], help_text="what the script is, e.g. 'nightly export'"
    )
    days = serializers.IntegerField(
        min_value=1, max_value=MAX_SCRIPT_TOKEN_DAYS, default=DEFAULT_SCRIPT_TOKEN_DAYS, help_text="lifetime"
    )
    user = serializers.CharField(
        max_length=150,
        required=False,
        help_text="operators only: the username the token acts as (default: the caller)",
    )


class TokenCreatedSerializer(TokenSerializer):
    token = serializers.CharField(help_text="the key, shown this once")


class TokenQuerySerializer(QuerySerializer):
    kind = serializers.ChoiceField(choices=ApiToken.Kind.choices, required=False)
    user = serializers.CharField(
        max_length=150, required=False, help_text="operators: only this username's tokens"
    )
