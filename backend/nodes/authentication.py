"""The API's token authentication: ``Authorization: Token <key>``, one key per login or script.

Keys are looked up by their SHA-256 (backend.nodes.tokens); an expired key is deleted on first
use and answered with 401 and a sentence; a disabled user's keys stop working at once.
"""

from __future__ import annotations

from rest_framework.authentication import TokenAuthentication

from backend.nodes import tokens


class ApiTokenAuthentication(TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key):
        token = tokens.authenticate_key(key)
        return token.user, token
