"""The Django admin's login, throttled and locked out like the API's (backend.api.throttling).

Without it, /admin/login/ would let a guesser try passwords at the speed of the server while
/api/auth/login refuses them: both count failures in the same place, so a lockout earned on
one holds on the other.
"""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.contrib.admin.apps import AdminConfig
from django.http import HttpResponse

from backend.api.throttling import (
    TOO_FAST,
    LoginAddressThrottle,
    LoginLockout,
    LoginRefused,
    LoginUsernameThrottle,
)


def _too_many(refusal: LoginRefused) -> HttpResponse:
    response = HttpResponse(str(refusal.detail), status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(refusal.wait)
    return response


class ThrottledAdminSite(AdminSite):
    def login(self, request, extra_context=None):
        if request.method != "POST":
            return super().login(request, extra_context)
        for throttle in (LoginAddressThrottle(), LoginUsernameThrottle()):
            # No DRF view here: these throttles read only the request.
            if not throttle.allow_request(request, None):  # type: ignore[arg-type]
                return _too_many(LoginRefused(throttle.wait() or 1, TOO_FAST))
        lockout = LoginLockout(request)
        try:
            lockout.check()
        except LoginRefused as refusal:
            return _too_many(refusal)
        response = super().login(request, extra_context)
        # The admin answers a good password with a redirect, a bad one with the form again.
        if response.status_code == 302 and request.user.is_authenticated:
            lockout.succeeded()
        else:
            lockout.failed()
        return response


class NodeAdminConfig(AdminConfig):
    """INSTALLED_APPS names this instead of django.contrib.admin: the same admin, this login."""

    default_site = "backend.nodes.admin_site.ThrottledAdminSite"
