"""JSON answers for what no API view answers: an unknown /api/ path (404), a CSRF refusal outside
DRF (403) and a crash outside DRF (500).

Django's own 404 and 500 pages are HTML; an API client reads JSON on every /api/ path, with
the same ``{"detail": sentence}`` body as every other error (backend.api.exception_handler).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views import csrf, defaults
from django.views.decorators.csrf import csrf_exempt

NO_ENDPOINT = "there is no API endpoint at this path (the endpoints are listed at /api/docs/)"


@csrf_exempt  # it changes nothing: a POST to a wrong path is a 404, not Django's HTML CSRF page
def api_not_found(request: HttpRequest, path: str = ""):
    """The last /api/ route: any path that no endpoint matched (/api/docs goes on to /api/docs/,
    as Django's APPEND_SLASH did before this route matched everything)."""
    if not request.path.endswith("/") and request.method in ("GET", "HEAD"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not api_not_found:
            return HttpResponsePermanentRedirect(
                request.get_full_path().replace(request.path, request.path + "/", 1)
            )
    return JsonResponse({"detail": NO_ENDPOINT}, status=404)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception=None):
    if _is_api(request):
        return JsonResponse({"detail": NO_ENDPOINT}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest):
    if _is_api(request):
        body = {
            "detail": "the node could not handle this request (an internal error); "
            "its operator finds the details in the node's log"
        }
        return JsonResponse(body, status=500)
    return defaults.server_error(request)


def csrf_failure(request: HttpRequest, reason: str = ""):
    """settings.CSRF_FAILURE_VIEW: a JSON 403 on /api/ paths (the dashboard's and DRF's shape)."""
    if _is_api(request):
        body = {
            "detail": f"CSRF check failed ({reason}): a write with the session cookie needs the X-CSRFToken header"
        }
        return JsonResponse(body, status=403)
    return csrf.csrf_failure(request, reason)
