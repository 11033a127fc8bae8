"""API tokens: one per login (a device), and named ones for scripts (backend.nodes.models.ApiToken).

A login's token lives DEFL_TOKEN_TTL_S seconds; logging out deletes that token only, so the
user's other devices and scripts keep working. A script token is named, lives the days asked
for (at most MAX_SCRIPT_TOKEN_DAYS) and is revoked by its user or an operator. The key is
shown once, when issued; the database keeps its SHA-256, its first characters and its times.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from backend.nodes.models import ApiToken

KEY_BYTES = 20  # 40 hex characters, as DRF's tokens were
MAX_SCRIPT_TOKEN_DAYS = 365
DEFAULT_SCRIPT_TOKEN_DAYS = 90
# A login beyond this many live ones ends the oldest: a script that logs in in a loop cannot
# grow the table without bound, and a person never has this many devices.
MAX_LOGINS_PER_USER = 50
# last_used is written at most this often per token: not one database write per request.
LAST_USED_EVERY_S = 60
EXPIRED = "the token has expired: log in again for a new one"
INVALID = "invalid token"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


def _new_key() -> str:
    return secrets.token_hex(KEY_BYTES)


def _issue(user, *, name: str, kind: str, lifetime: timedelta) -> tuple[ApiToken, str]:
    key = _new_key()
    now = timezone.now()
    token = ApiToken.objects.create(
        user=user,
        name=name[:100],
        kind=kind,
        digest=digest(key),
        prefix=key[:8],
        created=now,
        expires=now + lifetime,
    )
    return token, key


@transaction.atomic
def issue_login_token(user, device: str) -> tuple[ApiToken, str]:
    """A token for one login; the user's expired tokens and logins past the limit end here."""
    now = timezone.now()
    ApiToken.objects.filter(user=user, expires__lte=now).delete()
    token, key = _issue(
        user, name=device, kind=ApiToken.Kind.LOGIN, lifetime=timedelta(seconds=settings.DEFL_TOKEN_TTL_S)
    )
    logins = ApiToken.objects.filter(user=user, kind=ApiToken.Kind.LOGIN).order_by("-created", "-id")
    stale = list(logins.values_list("id", flat=True)[MAX_LOGINS_PER_USER:])
    if stale:
        ApiToken.objects.filter(id__in=stale).delete()
    return token, key


def issue_script_token(user, name: str, days: int = DEFAULT_SCRIPT_TOKEN_DAYS) -> tuple[ApiToken, str]:
    if not 1 <= days <= MAX_SCRIPT_TOKEN_DAYS:
        raise ValueError(f"a script token lives 1 to {MAX_SCRIPT_TOKEN_DAYS} days")
    return _issue(user, name=name, kind=ApiToken.Kind.SCRIPT, lifetime=timedelta(days=days))


def authenticate_key(key: str) -> ApiToken:
    """The live token of this key, or AuthenticationFailed (an expired one is deleted)."""
    token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first()
    if token is None or not token.user.is_active:
        raise AuthenticationFailed(INVALID)
    now = timezone.now()
    if token.expires <= now:
        token.delete()
        raise AuthenticationFailed(EXPIRED)
    if token.last_used is None or (now - token.last_used).total_seconds() > LAST_USED_EVERY_S:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        token.last_used = now
    return token


def revoke_all(user) -> int:
    """Ends every token of the user (a disabled account, a password reset); returns how many."""
    deleted, _ = ApiToken.objects.filter(user=user).delete()
    return deleted


_BROWSERS = (("Edg/", "Edge"), ("Firefox/", "Firefox"), ("Chrome/", "Chrome"), ("Safari/", "Safari"))
_SYSTEMS = (
    ("Android", "Android"),
    ("iPhone", "iPhone"),
    ("iPad", "iPad"),
    ("Windows", "Windows"),
    ("Mac OS X", "macOS"),
    ("Linux", "Linux"),
)
_DEVICE = re.compile(r"[^\w .,()/@+-]")


def device_name(given: str | None, user_agent: str) -> str:
    """What a login is called in the list of a user's logins: the name the client gave, or its
    browser and system read from the User-Agent ("Chrome on Linux"), or its first word."""
    if given and given.strip():
        return _DEVICE.sub("", given.strip())[:100] or "unnamed device"
    agent = user_agent or ""
    browser = next((name for marker, name in _BROWSERS if marker in agent), None)
    system = next((name for marker, name in _SYSTEMS if marker in agent), None)
    if browser:
        return f"{browser} on {system}" if system else browser
    word = _DEVICE.sub("", agent.split(" ", 1)[0])[:60]
    return word or "unknown client"
