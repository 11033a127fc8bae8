"""Login throttles and lockout, counted in the cache that all of a node's processes share.

Two rates (per client address, per username) slow a guesser down; the lockout stops one:
after DEFL_LOGIN_LOCKOUT_FAILURES failed logins in a row for a username, or from an
address, that username or address may not log in for DEFL_LOGIN_LOCKOUT_S seconds (429 with
Retry-After and a sentence), whatever the password. A success clears both counters.
Counting by username as well as by address stops a guesser that spreads its tries over
many addresses; the price is that a guesser can keep one account locked, for a bounded time.
"""

from __future__ import annotations

import hashlib
import math
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import APIException, Throttled
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

LOCKED = "too many failed logins for this account or from this address"
TOO_FAST = "too many login attempts for this account or from this address"


def client_address(request) -> str:
    # DRF's identity: the TCP peer unless DEFL_NUM_PROXIES trusted proxies sit in front. A
    # server that gives no peer address (a unix socket, a bare WSGI call) yields None: such
    # clients share one bucket rather than crash the login view (a 500 found by schemathesis).
    return BaseThrottle().get_ident(request) or ""


def wait_in_words(seconds: float) -> str:
    """ "in 40 seconds", "in 3 minutes", "in 2 hours": a wait rounded up, as a person reads it."""
    seconds = max(math.ceil(seconds), 1)
    unit, size = ("hour", 3600) if seconds >= 3600 else ("minute", 60) if seconds >= 60 else ("second", 1)
    count = math.ceil(seconds / size)
    return f"in {count} {unit}{'s' if count > 1 else ''}"


class LoginRefused(Throttled):
    """429 with Retry-After and one sentence (DRF's Throttled appends a second one of its own)."""

    def __init__(self, wait: float, reason: str):
        APIException.__init__(self, f"{reason}: try again {wait_in_words(wait)}")
        self.wait = max(math.ceil(wait), 1)


class RefusesLoginsPolitely:
    """For a login view: a rate throttle's 429 says what to do, in the same words as the lockout."""

    def throttled(self, request, wait):
        raise LoginRefused(wait or 1, TOO_FAST)


def _submitted_username(request) -> str:
    # A DRF request (the API's login) has .data, a Django one (the admin's login form) .POST.
    data = request.data if hasattr(request, "data") else request.POST
    username = data.get("username") if hasattr(data, "get") else None
    # Bounded and normalised: a megabyte of username must not become a megabyte of cache key.
    return str(username or "")[:256].strip().lower()


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:32]


class LoginAddressThrottle(SimpleRateThrottle):
    scope = "login_ip"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": _digest(client_address(request))}


class LoginUsernameThrottle(SimpleRateThrottle):
    scope = "login_user"

    def get_cache_key(self, request, view):
        username = _submitted_username(request)
        if not username:
            return None  # the form error (400) follows; the address throttle still counts it
        return self.cache_format % {"scope": self.scope, "ident": _digest(username)}


class LoginLockout:
    """Failed-login counters for one request's username and address."""

    def __init__(self, request):
        self.keys = [f"defl:login-fail:ip:{_digest(client_address(request))}"]
        username = _submitted_username(request)
        if username:
            self.keys.append(f"defl:login-fail:user:{_digest(username)}")

    def check(self) -> None:
        """Raise 429 while the username or the address is locked out."""
        now = time.time()
        locked_until = max((cache.get(key) or {}).get("until", 0) for key in self.keys)
        if locked_until > now:
            raise LoginRefused(locked_until - now, LOCKED)

    def failed(self) -> None:
        # get + set, not an atomic increment (the database cache has none): concurrent guesses
        # may add a few tries beyond the limit, which the rate throttles bound anyway.
        window = settings.DEFL_LOGIN_LOCKOUT_S
        for key in self.keys:
            entry = cache.get(key) or {"count": 0, "until": 0}
            entry["count"] += 1
            if entry["count"] >= settings.DEFL_LOGIN_LOCKOUT_FAILURES:
                entry = {"count": 0, "until": time.time() + window}
            cache.set(key, entry, timeout=window)

    def succeeded(self) -> None:
        cache.delete_many(self.keys)
