"""Token authentication with an expiry: a token is valid DEFL_TOKEN_TTL_S seconds after it was issued.

A stolen or forgotten token stops working on its own; an expired one is deleted on first use,
so the next login issues a fresh one (backend.nodes.accounts.api_token).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed


def token_expired(token, *, margin_s: float = 0) -> bool:
    """Whether ``token`` has expired, or will within ``margin_s`` seconds."""
    return token.created < timezone.now() - timedelta(seconds=settings.DEFL_TOKEN_TTL_S - margin_s)


class ExpiringTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        user, token = super().authenticate_credentials(key)
        if token_expired(token):
            token.delete()
            raise AuthenticationFailed("the token has expired: log in again for a new one")
        return user, token
